"""ExactRank: exact ranks within partitions without sorting a partition in one worker.

Elements are grouped into buckets whose order agrees with the sort order
(bucket = top bits of a uniform 64-bit value). The per-bucket counts are tiny,
so their prefix sums are computed once and broadcast as a side input; then
each bucket is sorted on its own and rank = offset(bucket) + index. Memory on a
worker is one bucket of metadata, never a partition.
"""

from __future__ import annotations

import apache_beam as beam

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


def _prefix_sums(counts: list) -> dict:
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


def _rank_bucket(element, table):
    (part, bucket), items = element
    total = table["totals"][part]
    for rank, value in ranked_bucket(table["offsets"][(part, bucket)], items):
        yield part, rank, total, value


class ExactRank(beam.PTransform):
    """(part, sort_key, bucket, value) -> (part, rank, total, value).

    ``rank`` is the 0-based position of the element when its partition is
    sorted by ``sort_key``; ``total`` is the partition's size. ``bucket`` must
    be monotone in ``sort_key`` within a partition. Values have a unique
    ``key`` attribute, which breaks ties between equal sort keys (so sort keys
    need not carry a copy of it).
    """

    def expand(self, elements):
        # (part, bucket) -> (sort_key, value)
        keyed = elements | "KeyByBucket" >> beam.Map(lambda e: ((e[0], e[2]), (e[1], e[3])))
        table = (
            keyed
            | "One" >> beam.Map(lambda kv: (kv[0], 1))
            | "CountPerBucket" >> beam.CombinePerKey(sum)
            | "AllCounts" >> beam.combiners.ToList()
            | "PrefixSums" >> beam.Map(_prefix_sums)
        )
        return (
            keyed
            | "GroupByBucket" >> beam.GroupByKey()
            | "RankInBucket" >> beam.FlatMap(_rank_bucket, beam.pvalue.AsSingleton(table))
        )
