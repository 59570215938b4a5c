"""PlanShards and OrderAndShard: the global shuffle and exact balance.

Per split, r = fp(seed, "order", key). ``balance="none"``: exact global rank
of r (see rank.py), shard = floor(rank * S / N), and the shard keeps rank
order, so reading shards 0..S-1 in order replays one uniform permutation and
shard sizes differ by at most one.

``balance="label"``: labels are laid end to end (sorted by name), each in
fingerprint order, and dealt round-robin to the S shards. Shard sizes still
differ by at most one, and every shard holds floor or ceil of n_c / S of each
label c. Inside a shard, item i of label c sits at position (i + u) / n_c
(u from the fingerprint), so every window of consecutive records carries the
split's label mix.
"""

from __future__ import annotations

import itertools
import math
import pickle

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.fingerprint import fp, unit
from beam_jobs.options import Job
from beam_jobs.rank import (
    BUCKET_BITS,
    LABEL_BUCKET_BITS,
    ExactRank,
    ranked_bucket,
    sort_key,
    top_bucket,
)
from beam_jobs.records import Image
from schemas.layout import MAX_SHARDS

RECORD_OVERHEAD = 160  # bytes of features besides the image, a rough upper bound


def estimated_record_bytes(im: Image, record_kind: str) -> int:
    extra = len(im.key) + len(im.label) + len(im.rel_path) + RECORD_OVERHEAD
    return extra + (im.num_bytes if record_kind == "image" else 0)


def shard_count(
    n: int, est_bytes: int, target_bytes: float, multiple: int, fixed: int | None
) -> int:
    """Shards for a split of n examples: by size, rounded up to a multiple, at most n."""
    if n == 0:
        return 0
    s = fixed if fixed else max(1, math.ceil(est_bytes / target_bytes))
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

    Every split named in ``--splits`` appears, empty ones with zero shards.
    ``buckets`` (only for balance none, from the order ``seed``): {bucket:
    (first rank, size)} of the split's rank buckets (``bucket_bits`` a split,
    as OrderAndShard's), in rank order.
    """

    def __init__(self, job: Job, bucket_bits: int = BUCKET_BITS):
        super().__init__()
        o = job.options
        self._splits = o.split_names
        self._kind = o.record_kind
        self._target = o.target_shard_mb * 1e6
        self._multiple = o.shard_multiple
        self._fixed = o.num_shards
        self._seed = o.seed if o.balance == "none" else None  # the global rank's bucket table
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
                    "num_shards": shard_count(n, est, self._target, self._multiple, self._fixed),
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


def _shard_of(rank: int, num_shards: int, total: int) -> int:
    return rank * num_shards // total


def _to_shards(split, r, bucket, im, plan):
    """-> ((split, shard), (bucket, r, Image)) for every shard that the bucket's ranks
    reach: one, or a few for a bucket across a shard boundary."""
    shards, total = plan[split]["num_shards"], plan[split]["num_examples"]
    first, size = plan[split]["buckets"][bucket]
    last = first + size - 1
    for shard in range(_shard_of(first, shards, total), _shard_of(last, shards, total) + 1):
        yield (split, shard), (bucket, r, im)


# Items a batch that crosses the shuffle, and items a worker holds at most
# before it sends what it has.
BATCH = 512
MAX_HELD = 8192


class _ToShardBatches(beam.DoFn):
    """(split, Image) -> ((split, shard), pickled [(bucket, r, Image)]).

    The items bound for one shard travel in batches of up to BATCH, pickled:
    the shuffle then moves a few hundred opaque values instead of an element
    an image (a local runner's main process decodes, groups and re-encodes
    every element it shuffles, alone, while the workers wait). A worker holds
    at most MAX_HELD items.
    """

    def __init__(self, seed: int, bucket_bits: int):
        self._seed, self._bits = seed, bucket_bits

    def start_bundle(self):
        self._held: dict[tuple, list] = {}
        self._count = 0

    def process(self, element, plan):
        split, im = element
        r = fp(self._seed, "order", im.key)
        for key, item in _to_shards(split, r, top_bucket(r, self._bits), im, plan):
            batch = self._held.setdefault(key, [])
            batch.append(item)
            self._count += 1
            if len(batch) == BATCH:
                yield self._send(key)
        if self._count >= MAX_HELD:
            yield from [self._send(key) for key in list(self._held)]

    def finish_bundle(self):
        for key in list(self._held):
            yield GlobalWindows.windowed_value(self._send(key))

    def _send(self, key):
        batch = self._held.pop(key)
        self._count -= len(batch)
        return key, pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)


def _rank_in_shard(element, plan):
    """((split, shard), [pickled batches]) -> ((split, shard), [Image] in rank order).

    Every bucket reaching the shard arrives whole, so each is ranked as
    ExactRank ranks it, and the shard keeps the ranks that fall in it.
    """
    (split, shard), batches = element
    info = plan[split]
    shards, total = info["num_shards"], info["num_examples"]
    buckets: dict[int, list] = {}
    for batch in batches:
        for bucket, r, im in pickle.loads(batch):
            buckets.setdefault(bucket, []).append((r, im))
    ranked = [
        (rank, im)
        for bucket, members in buckets.items()
        for rank, im in ranked_bucket(info["buckets"][bucket][0], members)
        if _shard_of(rank, shards, total) == shard
    ]
    ranked.sort(key=lambda item: item[0])
    return (split, shard), [im for _, im in ranked]


def _in_order(element):
    """((split, shard), [(sort_key, Image)]) -> ((split, shard), [Image] in order)."""
    shard, items = element
    return shard, [im for _, im in sorted(items, key=sort_key)]


class OrderAndShard(beam.PTransform):
    """(split, Image) -> ((split, shard), [Image] in the shard's order), given the plan.

    ``balance="none"`` needs one shuffle of the images: a shard is a range of
    ranks, a bucket (rank.py) is one too, so each image goes straight to the
    shard its bucket's ranks reach (two for the few buckets across a shard
    boundary: ``S - 1`` of 4096 buckets a split) and is ranked there.
    ``bucket_bits``: buckets a split, 2**bits (tests use few, to cross
    boundaries often).
    """

    def __init__(self, job: Job, plan, bucket_bits: int = BUCKET_BITS):
        super().__init__()
        self._seed = job.options.seed
        self._balance = job.options.balance
        self._plan = plan
        self._bits = bucket_bits

    def expand(self, split_images):
        seed = self._seed
        plan = beam.pvalue.AsSingleton(self._plan)
        if self._balance == "none":
            # the plan's bucket table (PlanShards with the seed) gives the ranks
            return (
                split_images
                | "ToShards" >> beam.ParDo(_ToShardBatches(seed, self._bits), plan)
                | "GroupByShard" >> beam.GroupByKey()
                | "RankInShard" >> beam.Map(_rank_in_shard, plan)
            )

        def to_label_rank(element):
            split, im = element
            r = fp(seed, "order", im.key)
            return (split, im.label), r, top_bucket(r, LABEL_BUCKET_BITS), im

        def to_balanced_shard(ranked, plan):
            (split, label), i, n_label, im = ranked
            info = plan[split]
            offset = info["label_offsets"][label]
            position = (i + unit(seed, "jitter", im.key)) / n_label
            key = (position, fp(seed, "order", im.key))
            return (split, (offset + i) % info["num_shards"]), (key, im)

        return (
            split_images
            | "OrderKeyByLabel" >> beam.Map(to_label_rank)
            # ((split, label), rank within label, label count, Image)
            | "RankInLabel" >> ExactRank()
            | "DealToShards" >> beam.Map(to_balanced_shard, plan)
            | "GroupByShard" >> beam.GroupByKey()
            | "InOrder" >> beam.Map(_in_order)
        )
