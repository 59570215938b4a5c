"""The listing: every input of an image folder or a CSV/JSONL manifest, as a
:class:`Candidate`, or a :class:`Reject` for one that fails before any file is opened
(bad label, bad path, unsupported extension, malformed manifest row, duplicate key).

Every input is in exactly one of the two; that is what makes ``inputs = written +
rejects`` reconcile. The rules are ``convert_core.candidates``, the folder walk
``convert_core.walk``. Beam's ``ReadInputs`` (``beam_jobs.sources``) walks the label
folders on workers and groups the duplicates there; ``list_inputs`` and ``unique``
do the same in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from convert_core import paths, walk
from convert_core.candidates import CandidateRules, rows_of
from convert_core.records import Candidate, Reject, make_reject
from schemas import storage


def listed(rules: CandidateRules, walked) -> Iterator[Candidate | Reject]:
    """The inputs of a walk's (path, None | (reason, detail)) items: a Candidate of each
    file (``rules.file``), else its Reject."""
    for source, rejected in walked:
        if rejected is None:
            yield rules.file(source)
        else:
            yield make_reject(paths.relative_to(rules.root, source) or source, source, *rejected)


def url_files(root: str):
    """A bucket folder's walk: every object under it that is not hidden is an input."""
    for path, _ in storage.match("**", folder=root):
        rel = paths.relative_to(root, path)
        if rel and not any(p.startswith(".") for p in rel.split("/")):
            yield path, None


def read_manifest(rules: CandidateRules, manifest: str):
    """A manifest's rows, each a Candidate or a Reject (blank lines are not inputs)."""
    with storage.open_text(manifest, errors="surrogateescape") as f:
        for number, row in rows_of(manifest, f):
            yield rules.row(number, row)


def list_inputs(rules: CandidateRules, manifest: str | None) -> list:
    """Every input, in one process: the rows of ``manifest``, or with none the image
    folder ``rules.root`` walked (pass 1 a label folder, then the symlinks they hold
    followed: ``convert_core.walk``)."""
    if manifest is not None:
        return list(read_manifest(rules, manifest))
    root, found, links, unlisted = rules.root, [], [], []
    for kind, name in walk.listing_work(root):
        if kind == "url":
            found += listed(rules, url_files(root))
        else:
            tree = walk.walk_tree(root, name, links, unlisted, recurse=kind == "tree")
            found += listed(rules, tree)
    if links or unlisted:
        found += listed(rules, walk.follow_links(root, sorted(links), frozenset(unlisted)))
    return found


def keep_first(root: str, reason: str, candidates: list[Candidate]):
    """A group of Candidates (one key: ``duplicate_key``; one file under several spellings:
    ``duplicate_file``) -> the lowest-row Candidate, and a ``reason`` Reject each other."""
    first, *others = sorted(candidates, key=lambda c: (c.row, c.key, c.source))
    yield first
    for c in others:
        if reason == "duplicate_key":
            detail = f"row {c.row}: key also at row {first.row}"
        else:
            detail = f"row {c.row}: the same file as row {first.row} (key {first.key})"
        source = paths.full_source(root, c.source, c.key)
        yield make_reject(c.key, source, reason, detail)


def one_split_per_group(root: str, group: str, candidates: list[Candidate]):
    """A ``--group_by`` group's Candidates, all with the split its rows give.

    A group never spans two splits: rows without a ``split`` value follow the
    group's rows that have one; rows that give two different splits are a
    contradiction, and every row of the group is a ``bad_split`` reject (no
    part of it is written to either split).
    """
    given = sorted({c.split for c in candidates if c.split is not None})
    if len(given) > 1:
        detail = f"group {group!r} is given splits {', '.join(given)} by different rows"
        for c in candidates:
            source = paths.full_source(root, c.source, c.key)
            yield make_reject(c.key, source, "bad_split", detail)
        return
    split = given[0] if given else None
    for c in candidates:
        yield c._replace(split=split)


def file_identity(root: str, candidate: Candidate) -> str:
    """What a manifest row's file is: its real path (symlinks and ``..`` resolved),
    as the folder walk knows files; a URL as written (normalized)."""
    source = paths.full_source(root, candidate.source, candidate.key)
    return source if paths.is_url(source) else os.path.realpath(source)


def unique(root: str, candidates: Iterable[Candidate]) -> tuple[list[Candidate], list[Reject]]:
    """A manifest's Candidates, in one process: a key, then a file, kept once
    (``keep_first``), then each ``--group_by`` group in one split
    (``one_split_per_group``); the others' Rejects."""
    kept, rejects = list(candidates), []
    for reason, identity in (
        ("duplicate_key", lambda c: c.key),
        ("duplicate_file", lambda c: file_identity(root, c)),
    ):
        groups = _by(kept, identity).values()
        found = [out for members in groups for out in keep_first(root, reason, members)]
        kept = [c for c in found if isinstance(c, Candidate)]
        rejects += [r for r in found if isinstance(r, Reject)]
    grouped = _by([c for c in kept if c.group is not None], lambda c: c.group)
    found = [out for g, members in grouped.items() for out in one_split_per_group(root, g, members)]
    kept = [c for c in kept if c.group is None] + [c for c in found if isinstance(c, Candidate)]
    return kept, rejects + [r for r in found if isinstance(r, Reject)]


def _by(candidates: list[Candidate], key) -> dict[str, list[Candidate]]:
    """The candidates grouped by ``key``."""
    out: dict[str, list[Candidate]] = {}
    for c in candidates:
        out.setdefault(key(c), []).append(c)
    return out
