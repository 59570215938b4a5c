"""PlanShards: the plan (``convert_core.plan_shards``) of the images of every split.

One pass over the metadata (a CombineFn, lifted before the shuffle) counts each
split's examples, estimated bytes, labels and, for ``balance="none"``, its rank
buckets; the plan is a side input of ``OrderAndShard`` (``beam_jobs.order``),
``WriteShards`` and ``Finalize``.
"""

from __future__ import annotations

import apache_beam as beam

from convert_core.plan_shards import add_stats, merge_stats, plan_of
from convert_core.rank import BUCKET_BITS


class _SplitStats(beam.CombineFn):
    """(split, Image) -> {split: [count, est_bytes, {label: count}, {bucket: count}]}
    (``add_stats``)."""

    def __init__(self, record_kind: str, seed: int | None = None, bucket_bits: int = BUCKET_BITS):
        self._kind = record_kind
        self._seed = seed
        self._bits = bucket_bits

    def create_accumulator(self):
        return {}

    def add_input(self, acc, element):
        split, im = element
        return add_stats(acc, split, im, self._kind, self._seed, self._bits)

    def merge_accumulators(self, accs):
        return merge_stats(accs)

    def extract_output(self, acc):
        return acc


class PlanShards(beam.PTransform):
    """(split, Image) -> one dict: {split: {num_examples, est_bytes, num_shards, label_counts,
    label_offsets, buckets}} (``plan_of``).

    ``buckets`` (only for balance none, from the order ``seed``): the split's rank
    buckets (``bucket_bits`` a split, as OrderAndShard's).
    """

    def __init__(
        self,
        split_names: tuple[str, ...],
        record_kind: str,
        target_shard_mb: float,
        shard_multiple: int,
        num_shards: int | None,
        seed: int,
        balance: str,
        bucket_bits: int = BUCKET_BITS,
        examples_per_shard: int | None = None,
    ):
        super().__init__()
        self._splits = split_names
        self._kind = record_kind
        self._target = target_shard_mb * 1e6
        self._multiple = shard_multiple
        self._fixed = num_shards
        self._per_shard = examples_per_shard
        self._seed = seed if balance == "none" else None  # the global rank's bucket table
        self._bits = bucket_bits

    def expand(self, split_images):
        rule = (self._splits, self._target, self._multiple, self._fixed, self._per_shard)
        return (
            split_images
            | "Stats" >> beam.CombineGlobally(_SplitStats(self._kind, self._seed, self._bits))
            | "Plan" >> beam.Map(plan_of, *rule)
        )
