"""The plan: what each split holds and how many shards it gets, before any is written.

Each split's examples, estimated bytes, labels and, for ``balance="none"``, its rank
buckets (``convert_core.rank``) are counted (``add_stats``, ``merge_stats``: Beam's
``PlanShards`` combines them over workers, ``split_stats`` in one process), and
``plan_of`` makes the plan of the counts.
"""

from __future__ import annotations

import itertools
import math

from convert_core.fingerprint import fp
from convert_core.rank import BUCKET_BITS, top_bucket
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


def add_stats(
    acc: dict, split: str, im: Image, record_kind: str, seed: int | None, bucket_bits: int
) -> dict:
    """Counts one image of ``split`` into ``acc``: {split: [count, est_bytes, {label:
    count}, {bucket: count}]}; ``seed`` given (balance none), its rank bucket too, so
    the plan carries the split's bucket table and the global rank needs no count of
    its own."""
    stats = acc.get(split)
    if stats is None:
        stats = acc[split] = [0, 0, {}, {}]
    stats[0] += 1
    stats[1] += estimated_record_bytes(im, record_kind)
    labels = stats[2]
    labels[im.label] = labels.get(im.label, 0) + 1
    if seed is not None:
        bucket = top_bucket(fp(seed, "order", im.key), bucket_bits)
        stats[3][bucket] = stats[3].get(bucket, 0) + 1
    return acc


def merge_stats(accs) -> dict:
    """The counts of several ``add_stats`` accumulators, as one."""
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


def split_stats(
    split_images, record_kind: str, seed: int | None = None, bucket_bits: int = BUCKET_BITS
) -> dict:
    """``add_stats`` of every (split, Image), in one process."""
    acc: dict = {}
    for split, im in split_images:
        add_stats(acc, split, im, record_kind, seed, bucket_bits)
    return acc


def plan_of(
    stats: dict,
    split_names: tuple[str, ...],
    target_bytes: float,
    multiple: int,
    fixed: int | None,
    per_shard: int | None,
) -> dict:
    """{split: {num_examples, est_bytes, num_shards, label_counts, label_offsets,
    buckets}} of the counts (``add_stats``): every split of ``split_names``, empty ones
    with zero shards (``shard_count``). ``buckets`` (balance none only): {bucket:
    (first rank, size)} of the split's rank buckets, in rank order."""
    out = {}
    for split in sorted(set(split_names) | set(stats)):
        n, est, labels, buckets = stats.get(split, (0, 0, {}, {}))
        label_counts = dict(sorted(labels.items()))
        offsets = itertools.accumulate(label_counts.values(), initial=0)
        sizes = dict(sorted(buckets.items()))
        firsts = itertools.accumulate(sizes.values(), initial=0)
        out[split] = {
            "num_examples": n,
            "est_bytes": est,
            "num_shards": shard_count(n, est, target_bytes, multiple, fixed, per_shard),
            "label_counts": label_counts,
            # where each label starts when labels are laid end to end (balance=label)
            "label_offsets": dict(zip(label_counts, offsets)),
            "buckets": {b: (first, size) for (b, size), first in zip(sizes.items(), firsts)},
        }
    return out
