"""ExactRank: exact ranks within partitions without sorting a partition in one worker.

Elements are grouped into buckets whose order agrees with the sort order
(bucket = top bits of a uniform 64-bit value). The per-bucket counts are tiny,
so their prefix sums are computed once and broadcast as a side input; then
each bucket is sorted on its own and rank = offset(bucket) + index. Memory on a
worker is one bucket of metadata, never a partition.
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs.fingerprint import BITS

BUCKET_BITS = 12  # 4096 buckets a partition: ~250 entries a bucket at 1M examples


def top_bucket(value: int) -> int:
    """Bucket of a uniform fingerprint: its top BUCKET_BITS bits (order preserving)."""
    return value >> (BITS - BUCKET_BITS)


def _prefix_sums(counts: list) -> dict:
    """[((part, bucket), n)] -> {"offsets": {(part, bucket): first rank}, "totals": {part: n}}."""
    offsets, totals = {}, {}
    for (part, bucket), n in sorted(counts):
        offsets[(part, bucket)] = totals.get(part, 0)
        totals[part] = totals.get(part, 0) + n
    return {"offsets": offsets, "totals": totals}


def _rank_bucket(element, table):
    (part, bucket), items = element
    offset = table["offsets"][(part, bucket)]
    total = table["totals"][part]
    for index, (_, value) in enumerate(sorted(items, key=lambda item: item[0])):
        yield part, offset + index, total, value


class ExactRank(beam.PTransform):
    """(part, sort_key, bucket, value) -> (part, rank, total, value).

    ``rank`` is the 0-based position of the element when its partition is
    sorted by ``sort_key``; ``total`` is the partition's size. ``bucket`` must
    be monotone in ``sort_key`` within a partition, and sort keys unique.
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
