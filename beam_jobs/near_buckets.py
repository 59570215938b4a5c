"""The near-duplicate candidates' buckets (``--dedupe near``, ``near_duplicates``): the
images sharing a band value, each bucket's matching pairs thinned to its minimum
spanning forest.

Two ways to the buckets. The hash's fingerprints (93 bytes) go into one table (a side
input: every image's key, fingerprint and given split, in key order), whose band
values are found in arrays and dealt to ``TABLE_PARTS`` parts, each a task
(:func:`part_edges`). The user's embedding (hundreds of bytes to kilobytes a vector)
is shuffled instead: each image to each of its band values (:func:`in_bands`, then a
GroupByKey and :func:`bucket_edges`). Both confirm a bucket's pairs with
:func:`bucket_forest`: the same edges whichever way (tested).
"""

from __future__ import annotations

import numpy as np

from beam_jobs.near_components import find
from convert_core.records import Image
from schemas.errors import InvalidValueError
from schemas.near import FINGERPRINT_CHARS


def in_bands(im: Image, rule, centre=None):
    if centre is not None:  # the user's embedding: bands from the run's mean vector
        rule = rule.centred(centre)
    raw = bytes.fromhex(im.near)  # half the hex: about 20 copies an image are shuffled
    for band in rule.bands_of(raw):
        yield band, (im.key, raw, im.split)


def bucket_edges(element, rule, centre=None):
    """((band, value), [(key, fingerprint's bytes, split)]) -> (weight, key, split, key, split)
    edges: :func:`bucket_forest` of the bucket's members sorted by key, their distinct
    fingerprints sorted as their hex sorts (``thumbs_apart`` is not symmetric)."""
    if centre is not None:
        rule = rule.centred(centre)
    (band, _), members = element
    if len(members) < 2:
        return
    members = sorted(members)
    unique = sorted({m[1] for m in members})
    at = {fp: i for i, fp in enumerate(unique)}
    ranks = np.array([at[m[1]] for m in members], dtype=np.int64)
    for w, a, b in bucket_forest(band, ranks, rule.parse_many(unique), rule):
        x, y = members[a], members[b]
        yield w, x[0], x[2], y[0], y[2]


def bucket_forest(band: int, ranks: np.ndarray, parsed, rule):
    """One bucket's members (in key order; ``ranks``: each one's distinct fingerprint,
    ``parsed``'s row) -> (weight, member, member) of its minimum spanning forest: the
    pairs that match (``rule.bucket_pairs``: the hash's rule, ``near.matches``, or the
    embedding's cosine) and share no value of an earlier band (a pair is confirmed in
    the buckets of the first band it shares only, not in each), between the first
    members of their fingerprints, and identical fingerprints at weight 0 (in band 0:
    they share every band). The forest of all the buckets' forests is that of all the
    pairs."""
    count = len(ranks)
    first = np.full(int(ranks.max()) + 1, count, dtype=np.int64)
    np.minimum.at(first, ranks, np.arange(count))  # the first member of each fingerprint
    later = np.flatnonzero(first[ranks] != np.arange(count)) if band == 0 else ranks[:0]
    weight, a, b = np.zeros(len(later), np.int64), first[ranks[later]], later
    i, j, weights = rule.bucket_pairs(parsed, band)
    if len(i):
        ends = np.sort(np.stack([first[i], first[j]]), axis=0)
        weight = np.concatenate([weight, weights])
        a, b = np.concatenate([a, ends[0]]), np.concatenate([b, ends[1]])
    parent = list(range(count))
    joined = 0
    for n in np.lexsort((b, a, weight)).tolist():  # members in key order: indices order too
        ra, rb = find(parent, int(a[n])), find(parent, int(b[n]))
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
            yield int(weight[n]), int(a[n]), int(b[n])
            joined += 1
            if joined == count - 1:  # one tree: no edge joins more
                return


TABLE_PARTS = 22  # the buckets are dealt to this many parts (2 a band at the default
# distance), each one's work a task


def member(im: Image) -> tuple[str, bytes, str | None]:
    return im.key, bytes.fromhex(im.near), im.split


def table_of(members: list) -> tuple[tuple, bytes, tuple]:
    """[(key, fingerprint's bytes, given split)] -> (keys, the fingerprints joined, given
    splits), in key order: every image's 93 bytes and key in one side input."""
    members = sorted(members)
    return (
        tuple(m[0] for m in members),
        b"".join(m[1] for m in members),
        tuple(m[2] for m in members),
    )


def part_edges(part: int, table, rule, parts: int):
    """One part of the buckets (``rule.buckets``: the band values two or more
    fingerprints share, found in the table's arrays) -> each bucket's edges
    (:func:`bucket_forest` on the table's rows: no member copied)."""
    keys, joined, splits = table
    if len(keys) < 2:
        return
    width = FINGERPRINT_CHARS // 2
    if len(joined) != len(keys) * width:  # every hash fingerprint is one length
        raise InvalidValueError(
            f"a near-duplicate table of {len(keys)} keys holds {len(joined)} bytes"
        )
    parsed = rule.parse_many(joined)
    rows = np.frombuffer(joined, dtype=f"V{width}")  # byte order: as the hex sorts
    rank = np.unique(rows, return_inverse=True)[1].ravel()
    for band, _, owners in rule.buckets(parsed, part, parts):
        _, first, ranks = np.unique(rank[owners], return_index=True, return_inverse=True)
        rows_of = owners[first]  # a table row of each distinct fingerprint, in hex order
        ranks = ranks.ravel()
        for w, a, b in bucket_forest(band, ranks, tuple(c[rows_of] for c in parsed), rule):
            x, y = int(owners[a]), int(owners[b])
            yield w, keys[x], splits[x], keys[y], splits[y]
