"""PlanShards: what each split holds and how many shards it gets, before any is written.

One pass over the metadata (a CombineFn, lifted before the shuffle) counts
each split's examples, estimated bytes, labels and, for ``balance="none"``,
its rank buckets (``rank.py``); the plan is a side input of
``OrderAndShard`` (``beam_jobs.order``), ``WriteShards`` and ``Finalize``.
"""

from __future__ import annotations

import itertools
import math

import apache_beam as beam

from beam_jobs.rank import BUCKET_BITS, top_bucket
from convert_core.fingerprint import fp
from convert_core.records import Image
from schemas.layout import MAX_SHARDS

RECORD_OVERHEAD = 160  # bytes of features besides the image, a rough upper bound


def estimated_record_bytes(im: Image, record_kind: str) -> int:
    extra = len(im.key) + len(im.label) + len(im.rel_path) + RECORD_OVERHEAD
    return extra + (im.num_bytes if record_kind != "path" else 0)  # image, example: its bytes


def shard_count(
    n: int,
    est_bytes: int,
    target_bytes: float,
    multiple: int,
    fixed: int | None,
    per_shard: int | None = None,
) -> int:
    """Shards for a split of n examples: ``fixed`` (--num_shards), else ⌈n / per_shard⌉
    (--examples_per_shard), else by size; rounded up to a multiple, at most n."""
    if n == 0:
        return 0
    if fixed:
        s = fixed
    elif per_shard:
        s = math.ceil(n / per_shard)
    else:
        s = max(1, math.ceil(est_bytes / target_bytes))
    s = math.ceil(s / multiple) * multiple
    # five digits in the shard name: at most MAX_SHARDS, kept a multiple
    s = min(s, MAX_SHARDS // multiple * multiple)
    return min(s, n)


class _SplitStats(beam.CombineFn):
    """(split, Image) -> {split: [count, est_bytes, {label: count}, {bucket: count}]}.

    ``seed`` given (balance none): each image's rank bucket (rank.py) is
    counted too, so the plan carries the split's bucket table and the global
    rank needs no combine of its own.
    """

    def __init__(self, record_kind: str, seed: int | None = None, bucket_bits: int = BUCKET_BITS):
        self._kind = record_kind
        self._seed = seed
        self._bits = bucket_bits

    def create_accumulator(self):
        return {}

    def add_input(self, acc, element):
        split, im = element
        stats = acc.get(split)
        if stats is None:
            stats = acc[split] = [0, 0, {}, {}]
        stats[0] += 1
        stats[1] += estimated_record_bytes(im, self._kind)
        labels = stats[2]
        labels[im.label] = labels.get(im.label, 0) + 1
        if self._seed is not None:
            bucket = top_bucket(fp(self._seed, "order", im.key), self._bits)
            stats[3][bucket] = stats[3].get(bucket, 0) + 1
        return acc

    def merge_accumulators(self, accs):
        out = {}
        for acc in accs:
            for split, (n, b, labels, buckets) in acc.items():
                stats = out.setdefault(split, [0, 0, {}, {}])
                stats[0] += n
                stats[1] += b
                for counts, into in ((labels, stats[2]), (buckets, stats[3])):
                    for k, c in counts.items():
                        into[k] = into.get(k, 0) + c
        return out

    def extract_output(self, acc):
        return acc


class PlanShards(beam.PTransform):
    """(split, Image) -> one dict: {split: {num_examples, est_bytes, num_shards, label_counts,
    label_offsets, buckets}}.

    Every split of ``split_names`` appears, empty ones with zero shards (``shard_count``).
    ``buckets`` (only for balance none, from the order ``seed``): {bucket:
    (first rank, size)} of the split's rank buckets (``bucket_bits`` a split,
    as OrderAndShard's), in rank order.
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
        def plan(stats):
            out = {}
            for split in sorted(set(self._splits) | set(stats)):
                n, est, labels, buckets = stats.get(split, (0, 0, {}, {}))
                label_counts = dict(sorted(labels.items()))
                offsets = itertools.accumulate(label_counts.values(), initial=0)
                sizes = dict(sorted(buckets.items()))
                firsts = itertools.accumulate(sizes.values(), initial=0)
                out[split] = {
                    "num_examples": n,
                    "est_bytes": est,
                    "num_shards": shard_count(
                        n, est, self._target, self._multiple, self._fixed, self._per_shard
                    ),
                    "label_counts": label_counts,
                    # where each label starts when labels are laid end to end (balance=label)
                    "label_offsets": dict(zip(label_counts, offsets)),
                    "buckets": {
                        b: (first, size) for (b, size), first in zip(sizes.items(), firsts)
                    },
                }
            return out

        return (
            split_images
            | "Stats" >> beam.CombineGlobally(_SplitStats(self._kind, self._seed, self._bits))
            | "Plan" >> beam.Map(plan)
        )
