"""Exact ranks by fingerprint, in buckets whose order agrees with the sort order.

A partition's elements are grouped into buckets (bucket = top bits of a uniform
64-bit value); a bucket's first rank is the sum of the sizes of the buckets before it,
and inside a bucket the elements are ranked by sorting it alone. Beam's ``ExactRank``
(``beam_jobs.rank``) spreads the buckets over workers; ``ranked`` ranks a partition
held whole, in one process: the same ranks.
"""

from __future__ import annotations

from convert_core.fingerprint import BITS

# Buckets a partition. A split: 4096 (~250 entries a bucket at 1M examples).
# A (split, label) or a label: 64, so the broadcast table stays small with many
# labels (1000 labels x 3 splits -> at most 192k entries) while a bucket of a
# 100k-example label still holds only ~1.6k entries.
BUCKET_BITS = 12
LABEL_BUCKET_BITS = 6


def top_bucket(value: int, bits: int = BUCKET_BITS) -> int:
    """Bucket of a uniform fingerprint: its top ``bits`` bits (order preserving)."""
    return value >> (BITS - bits)


def prefix_sums(counts: list) -> dict:
    """[((part, bucket), n)] -> {"offsets": {(part, bucket): first rank}, "totals": {part: n}}."""
    offsets, totals = {}, {}
    for (part, bucket), n in sorted(counts):
        offsets[(part, bucket)] = totals.get(part, 0)
        totals[part] = totals.get(part, 0) + n
    return {"offsets": offsets, "totals": totals}


def sort_key(item):
    """(sort_key, value) -> its place: ties (equal fingerprints) broken by the unique key."""
    key, value = item
    return key, value.key


def ranked_bucket(offset: int, items):
    """(rank, value) of one whole bucket's (sort_key, value) items, in rank order;
    ``offset``: the bucket's first rank."""
    for index, (_, value) in enumerate(sorted(items, key=sort_key)):
        yield offset + index, value


def ranked(items) -> list:
    """(rank, value) of a whole partition's (sort_key, value) items, in rank order: the
    partition as one bucket."""
    return list(ranked_bucket(0, items))
