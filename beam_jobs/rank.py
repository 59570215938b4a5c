"""ExactRank: exact ranks within partitions without sorting a partition in one worker.

Elements are grouped into buckets whose order agrees with the sort order
(``convert_core.rank``). The per-bucket counts are tiny, so their prefix sums are
computed once and broadcast as a side input; then each bucket is sorted on its own
and rank = offset(bucket) + index. Memory on a worker is one bucket of metadata,
never a partition.
"""

from __future__ import annotations

import apache_beam as beam

from convert_core.rank import prefix_sums, ranked_bucket


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
            | "PrefixSums" >> beam.Map(prefix_sums)
        )
        return (
            keyed
            | "GroupByBucket" >> beam.GroupByKey()
            | "RankInBucket" >> beam.FlatMap(_rank_bucket, beam.pvalue.AsSingleton(table))
        )
