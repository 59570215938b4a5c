"""NearDuplicates (``--dedupe near``): clusters of near-duplicate images, each kept in
one split (or reduced to one image with ``--near_keep one``).

A re-encoded, resized or slightly cut copy of a photo has another key and other
bytes, so neither the key's hash nor ``--dedupe content`` keeps it out of the
other split. Here each image's 64-bit fingerprint (``schemas.near``, taken
while inspection decodes it) is compared with the others that share one of its
bands:

1. Image -> ((band, band value), (key, fingerprint, given split)), ``distance +
   1`` a image: two fingerprints within ``distance`` bits share a band value.
2. Per band value: the pairs within ``distance`` bits, joined into the bucket's
   clusters, each given as edges from its smallest key. Memory: one band
   value's fingerprints.
3. All edges -> one union-find (a CombineFn): each key in a cluster -> (the
   cluster's smallest key, the split given to its smallest key that has one).
   Memory: the keys that have a near-duplicate (with ``--group_by``, also
   those in a group), never the dataset.
4. Each image, with that table as a side input: in a cluster, its ``group``
   becomes the cluster's smallest key (the split's hash then keeps the cluster
   together, where its smallest key alone would land), and an image without a
   given split takes the cluster's. ``--near_keep one`` keeps the cluster's
   smallest key given a split by the manifest (else its smallest key) and
   rejects the others as ``near_duplicate``.

A manifest ``split`` value still wins; a cluster whose members are given two
splits keeps them as given (counted in the summary as ``given_two_splits``).
With ``--group_by``, a cluster that joins two groups joins them whole.
Deterministic on every runner: the table depends on the edges only, not on
their order.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from beam_jobs import paths
from beam_jobs.dead_letters import SplitRejects
from beam_jobs.records import Image, make_reject
from schemas import near

_GROUP = "\x00group\x00"  # a --group_by group's node in the union-find (never a key)


def _in_bands(im: Image, distance: int):
    value = near.to_int(im.near)
    for band in near.bands(value, distance):
        yield band, (im.key, im.near, im.split)


def _bucket_edges(element, distance: int):
    """((band, value), [(key, fingerprint, split)]) -> (key, split, key, split) edges:
    each cluster of the bucket as a star from its smallest key."""
    _, members = element
    if len(members) < 2:
        return
    members = sorted(members)
    values = near.as_array(m[1] for m in members)
    unique, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    parent = list(range(len(members)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = root(i), root(j)
        if a != b:  # the smaller index (smaller key: members are sorted) is the root
            parent[max(a, b)] = min(a, b)

    for i, u in enumerate(inverse):  # identical fingerprints
        join(i, int(first[u]))
    for a, b, _ in near.close_pairs(unique, distance):
        join(int(first[a]), int(first[b]))
    for i, (key, _, split) in enumerate(members):
        r = root(i)
        if r != i:
            yield members[r][0], members[r][2], key, split


class _Clusters(beam.CombineFn):
    """Edges (key, split, key, split) -> (table, counts): the table maps every key in a
    cluster to (the cluster's smallest key, its given split, the key to keep);
    counts are the clusters of near-duplicates (not the groups they join), the
    inputs in them, and the joined clusters given two splits."""

    def create_accumulator(self):
        # node -> parent (every edge); key -> parent (near edges only); key -> given split
        return {}, {}, {}

    def add_input(self, acc, edge):
        parent, close, given = acc
        a, split_a, b, split_b = edge
        for node, split in ((a, split_a), (b, split_b)):
            parent.setdefault(node, node)
            if not node.startswith(_GROUP):
                given[node] = split
        _union(parent, a, b)
        if not b.startswith(_GROUP):
            close.setdefault(a, a)
            close.setdefault(b, b)
            _union(close, a, b)
        return acc

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for other in accs:
            for mine, theirs in zip(merged[:2], other[:2]):
                for node, up in theirs.items():
                    mine.setdefault(node, node)
                    mine.setdefault(up, up)
                    _union(mine, node, up)
            merged[2].update(other[2])
        return merged

    def extract_output(self, acc):
        parent, close, given = acc
        members: dict[str, list[str]] = {}
        for node in parent:
            if not node.startswith(_GROUP):
                members.setdefault(_find(parent, node), []).append(node)
        table, two, largest = {}, 0, 0
        for keys in members.values():
            if not any(k in close for k in keys):  # a --group_by group with no near edge
                continue
            keys.sort()
            splits = [given[k] for k in keys if given[k] is not None]
            keeper = next((k for k in keys if given[k] is not None), keys[0])
            two += len(set(splits)) > 1
            largest = max(largest, len(keys))
            for k in keys:
                table[k] = (keys[0], splits[0] if splits else None, keeper)
        counts = {
            "clusters": len({_find(close, k) for k in close}),
            "inputs_in_clusters": len(close),
            "given_two_splits": two,
            "largest_cluster": largest,  # with the --group_by groups it joins
        }
        return table, counts


def _find(parent: dict, node: str) -> str:
    while parent[node] != node:
        parent[node] = parent[parent[node]]
        node = parent[node]
    return node


def _union(parent: dict, a: str, b: str) -> None:
    ra, rb = _find(parent, a), _find(parent, b)
    if ra != rb:  # the smaller name is the root: the same table for any edge order
        parent[max(ra, rb)] = min(ra, rb)


def _group_edges(im: Image):
    if im.group is not None:
        yield im.key, im.split, _GROUP + im.group, None


class _Assign(beam.DoFn):
    """Image -> Image in its cluster (group and split set), or a ``near_duplicate``
    Reject (``--near_keep one``: the cluster's first key given a split is kept, else its
    smallest key)."""

    def __init__(self, keep_one: bool, source_root: str | None):
        self._keep_one, self._root = keep_one, source_root

    def process(self, im: Image, clusters):
        found = clusters[0].get(im.key)
        if found is None:  # no near-duplicate
            yield im
            return
        smallest, split, keeper = found
        if not self._keep_one:
            yield im._replace(group=smallest, split=im.split if im.split is not None else split)
        elif im.key == keeper:
            yield im
        else:
            source = paths.full_source(self._root, im.source, im.key)
            detail = f"in the cluster of near-duplicates of {keeper}, which is kept"
            yield make_reject(im.key, source, "near_duplicate", detail)


def summary(clusters: tuple, distance: int, keep: str) -> dict:
    """What dataset_info.json says of the clusters found."""
    counts = clusters[1]
    rejected = counts["inputs_in_clusters"] - counts["clusters"] if keep == "one" else 0
    return {"distance": distance, "keep": keep, **counts, "rejected": rejected}


class NearDuplicates(beam.PTransform):
    """Image (with ``near``) -> {main: Image, rejects: Reject, summary: one dict}.

    ``distance``: bits within which two fingerprints are near-duplicates; ``keep``:
    "all" (a cluster in one split) or "one" (one image a cluster, the others rejected);
    ``group_by``: whether images carry manifest groups (joined by their clusters).
    """

    def __init__(self, distance: int, keep: str, group_by: bool, source_root: str | None):
        super().__init__()
        self._distance, self._keep, self._groups = distance, keep, group_by
        self._root = source_root

    def expand(self, images):
        distance, keep = self._distance, self._keep
        edges = (
            images
            | "InBands" >> beam.FlatMap(_in_bands, distance)
            | "GroupByBand" >> beam.GroupByKey()
            | "PairsInBand" >> beam.FlatMap(_bucket_edges, distance)
        )
        if self._groups and keep == "all":
            groups = images | "GroupEdges" >> beam.FlatMap(_group_edges)
            edges = (edges, groups) | "AllEdges" >> beam.Flatten()
        clusters = edges | "Clusters" >> beam.CombineGlobally(_Clusters())
        assigned = images | "Assign" >> beam.ParDo(
            _Assign(keep == "one", self._root), beam.pvalue.AsSingleton(clusters)
        )
        out = assigned | "SplitRejects" >> SplitRejects()
        return {
            "main": out["main"],
            "rejects": out["rejects"],
            "summary": clusters | "Summary" >> beam.Map(summary, distance, keep),
        }
