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
   given split takes the cluster's. ``--near_keep one`` keeps the smallest key
   and rejects the others as ``near_duplicate``.

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
    """Edges (key, split, key, split) -> {key: (cluster's smallest key, its given split)}
    for every key in a cluster, and the summary under the key None."""

    def create_accumulator(self):
        return {}, {}, set()  # node -> parent, key -> given split, keys with a near edge

    def add_input(self, acc, edge):
        parent, given, close = acc
        a, split_a, b, split_b = edge
        for node, split in ((a, split_a), (b, split_b)):
            parent.setdefault(node, node)
            if not node.startswith(_GROUP):
                given[node] = split
        if not b.startswith(_GROUP):
            close.update((a, b))
        _union(parent, a, b)
        return acc

    def merge_accumulators(self, accs):
        parent, given, close = self.create_accumulator()
        for other_parent, other_given, other_close in accs:
            given.update(other_given)
            close.update(other_close)
            for node, up in other_parent.items():
                parent.setdefault(node, node)
                parent.setdefault(up, up)
                _union(parent, node, up)
        return parent, given, close

    def extract_output(self, acc):
        """{key: (the cluster's smallest key, its split, members, distinct given splits)}
        for the keys in a cluster of near-duplicates (with the --group_by groups it
        joins); keys in a group that has none are left out."""
        parent, given, close = acc
        members: dict[str, list[str]] = {}
        for node in parent:
            if not node.startswith(_GROUP):
                members.setdefault(_find(parent, node), []).append(node)
        table: dict = {}
        for keys in members.values():
            if not close.intersection(keys):
                continue
            keys.sort()
            splits = [given[k] for k in keys if given[k] is not None]
            for k in keys:
                table[k] = (keys[0], splits[0] if splits else None, len(keys), len(set(splits)))
        return table


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
    Reject (``--near_keep one``)."""

    def __init__(self, keep_one: bool, source_root: str | None):
        self._keep_one, self._root = keep_one, source_root

    def process(self, im: Image, table):
        found = table.get(im.key)
        if found is None:  # no near-duplicate
            yield im
            return
        smallest, split, _, _ = found
        if self._keep_one:
            if im.key == smallest:
                yield im
            else:
                source = paths.full_source(self._root, im.source, im.key)
                yield make_reject(
                    im.key, source, "near_duplicate", f"a near-duplicate of {smallest}"
                )
            return
        yield im._replace(group=smallest, split=im.split if im.split is not None else split)


def summary(table: dict, distance: int, keep: str) -> dict:
    """What dataset_info.json says of the clusters found."""
    clusters = {v[0]: v for v in table.values()}
    inputs = sum(v[2] for v in clusters.values())
    return {
        "distance": distance,
        "keep": keep,
        "clusters": len(clusters),
        "inputs_in_clusters": inputs,
        "rejected": inputs - len(clusters) if keep == "one" else 0,
        "given_two_splits": sum(1 for v in clusters.values() if v[3] > 1),
    }


class NearDuplicates(beam.PTransform):
    """Image (with ``near``) -> {main: Image, rejects: Reject, summary: one dict}.

    ``distance``: bits within which two fingerprints are near-duplicates; ``keep``:
    "all" (a cluster in one split) or "one" (its smallest key, the others rejected);
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
        table = edges | "Clusters" >> beam.CombineGlobally(_Clusters())
        assigned = images | "Assign" >> beam.ParDo(
            _Assign(keep == "one", self._root), beam.pvalue.AsSingleton(table)
        )
        out = assigned | "SplitRejects" >> SplitRejects()
        return {
            "main": out["main"],
            "rejects": out["rejects"],
            "summary": table | "Summary" >> beam.Map(summary, distance, keep),
        }
