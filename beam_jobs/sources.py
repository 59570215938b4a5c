"""ReadInputs: the inputs as a PCollection, from an image folder or a CSV/JSONL manifest
(``convert_core.listing``): the label folders walked on workers, a manifest's
duplicates and groups found by grouping over workers.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_jobs.dead_letters import SplitRejects
from convert_core import walk
from convert_core.candidates import CandidateRules
from convert_core.listing import (
    file_identity,
    keep_first,
    listed,
    one_split_per_group,
    read_manifest,
    url_files,
)
from schemas.progress import Progress


class _ListImageFolder(beam.DoFn):
    """work item (``walk.listing_work``) -> chunks of Candidate | Reject, and walk.Links.

    Label = first-level sub-folder. Hidden files and folders are ignored (not
    inputs). The label folders are walked in parallel (pass 1,
    ``walk.walk_tree``); the symlinks they hold are followed afterwards, all
    in one place (``follow``).
    """

    def __init__(self, rules: CandidateRules):
        self._rules = rules
        self._listed = Metrics.counter("evenshard", "files_listed")

    def process(self, item: tuple[str, str]):
        kind, name = item
        root = self._rules.root
        if kind == "url":
            yield from chunked(self._listing(url_files(root)))
            return
        links: list[str] = []
        unlisted: list[str] = []
        tree = walk.walk_tree(root, name, links, unlisted, recurse=kind == "tree")
        yield from chunked(self._listing(tree))
        if links or unlisted:
            yield walk.Links(tuple(links), tuple(unlisted))

    def follow(self, found: list):
        """All the walk's Links -> chunks of the files reached through symlinks."""
        links = sorted(link for f in found for link in f.links)
        unlisted = frozenset(u for f in found for u in f.unlisted)
        yield from chunked(self._listing(walk.follow_links(self._rules.root, links, unlisted)))

    def _listing(self, files):
        progress = Progress("list", "files")
        for found in listed(self._rules, files):
            self._listed.inc()
            progress.add()
            yield found


# Inputs a listed element: Beam's cost per element between steps (encode, count,
# filter, key for the Reshuffle: ~40 us) was most of a serial listing's time.
CHUNK = 256


def chunked(items, size: int = CHUNK):
    """Lists of up to ``size`` consecutive items."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _ReadManifest(beam.DoFn):
    """manifest path -> chunks of Candidate | Reject, a row each (blank lines are not inputs)."""

    def __init__(self, rules: CandidateRules):
        self._rules = rules
        self._rows = Metrics.counter("evenshard", "manifest_rows")

    def process(self, manifest: str):
        yield from chunked(self._listing(manifest))

    def _listing(self, manifest: str):
        progress = Progress("list", "rows")
        for found in read_manifest(self._rules, manifest):
            self._rows.inc()
            progress.add()
            yield found


class _KeepFirst(beam.DoFn):
    """(key, [Candidate]) -> the lowest-row Candidate; the others are ``reason`` rejects.

    Grouped by ``key``: the same key on two rows (``duplicate_key``), or the
    same file under two spellings (``duplicate_file``, keyed by
    ``file_identity``).
    """

    def __init__(self, root: str, reason: str):
        self._root, self._reason = root, reason

    def process(self, element):
        _, candidates = element
        yield from keep_first(self._root, self._reason, candidates)


class _OneSplitPerGroup(beam.DoFn):
    """(group, [Candidate]) -> the group's Candidates, all with the split its rows give.

    A group never spans two splits: rows without a ``split`` value follow the
    group's rows that have one; rows that give two different splits are a
    contradiction, and every row of the group is a ``bad_split`` reject (no
    part of it is written to either split).
    """

    def __init__(self, root: str):
        self._root = root

    def process(self, element):
        group, candidates = element
        yield from one_split_per_group(self._root, group, candidates)


def _items(chunk):
    return chunk


def _is_chunk(element) -> bool:
    return isinstance(element, list)


def _is_links(element) -> bool:
    return isinstance(element, walk.Links)


class _ListFolder(beam.PTransform):
    """PBegin -> chunks of Candidate | Reject: the label folders walked in parallel,
    then the symlinks they hold followed in one place."""

    def __init__(self, rules: CandidateRules):
        super().__init__()
        self._rules = rules

    def expand(self, pbegin):
        lister = _ListImageFolder(self._rules)
        walked = (
            pbegin
            | "Start" >> beam.Create([self._rules.root])
            | "Folders" >> beam.FlatMap(walk.listing_work)
            | "SpreadFolders" >> beam.Reshuffle()
            | "Walk" >> beam.ParDo(lister)
        )
        followed = (
            walked
            | "Links" >> beam.Filter(_is_links)
            | "AllLinks" >> beam.combiners.ToList()
            | "FollowLinks" >> beam.FlatMap(lister.follow)
        )
        files = walked | "Files" >> beam.Filter(_is_chunk)
        return (files, followed) | "AllListed" >> beam.Flatten()


class ReadInputs(beam.PTransform):
    """PBegin -> {main: Candidate, rejects: Reject, inputs: count of all inputs}.

    The rows of ``manifest``, or with none the image folder ``rules.root``, each
    through ``rules``.
    """

    def __init__(self, rules: CandidateRules, manifest: str | None = None):
        super().__init__()
        self._rules, self._manifest = rules, manifest

    def expand(self, pbegin):
        manifest = self._manifest
        # -> [Candidate | Reject], in chunks (CHUNK)
        if manifest is not None:
            chunks = (
                pbegin
                | "Start" >> beam.Create([manifest])
                | "List" >> beam.ParDo(_ReadManifest(self._rules))
            )
        else:
            chunks = pbegin | "ListFolder" >> _ListFolder(self._rules)
        inputs = (
            chunks
            | "ChunkSize" >> beam.Map(len)
            | "CountInputs" >> beam.CombineGlobally(sum)  # 0 for an empty listing
        )
        if manifest is None:
            # Paths under one root are unique keys already: no dedupe, just spread.
            chunks = chunks | "Spread" >> beam.Reshuffle()
        listed = chunks | "Unchunk" >> beam.FlatMap(_items) | "SplitListing" >> SplitRejects()
        if manifest is not None:
            # key -> [Candidate] -> the first; the GroupByKey also spreads the
            # listing's single bundle over workers. Then the same for the file
            # itself: one file under two spellings is one input, not two.
            root = self._rules.root
            unique = (
                listed["main"]
                | "KeyByKey" >> beam.Map(lambda c: (c.key, c))
                | "GroupByKey" >> beam.GroupByKey()
                | "KeepFirstOfKey" >> beam.ParDo(_KeepFirst(root, "duplicate_key"))
                | "SplitDuplicates" >> SplitRejects()
            )
            files = (
                unique["main"]
                | "KeyByFile" >> beam.Map(lambda c: (file_identity(root, c), c))
                | "GroupByFile" >> beam.GroupByKey()
                | "KeepFirstOfFile" >> beam.ParDo(_KeepFirst(root, "duplicate_file"))
                | "SplitSameFiles" >> SplitRejects()
            )
            candidates = files["main"]
            rejects = [listed["rejects"], unique["rejects"], files["rejects"]]
            if self._rules.group_by:
                # group -> [Candidate] -> one split a group (rows without a group value
                # are groups of their own: they pass by)
                grouped = (
                    candidates
                    | "InAGroup" >> beam.Filter(lambda c: c.group is not None)
                    | "KeyByGroup" >> beam.Map(lambda c: (c.group, c))
                    | "GroupByGroup" >> beam.GroupByKey()
                    | "OneSplitPerGroup" >> beam.ParDo(_OneSplitPerGroup(root))
                    | "SplitGroupRejects" >> SplitRejects()
                )
                alone = candidates | "NoGroup" >> beam.Filter(lambda c: c.group is None)
                candidates = (grouped["main"], alone) | "AllGrouped" >> beam.Flatten()
                rejects.append(grouped["rejects"])
            rejects = tuple(rejects) | "ListingRejects" >> beam.Flatten()
        else:
            candidates, rejects = listed["main"], listed["rejects"]
        return {"main": candidates, "rejects": rejects, "inputs": inputs}
