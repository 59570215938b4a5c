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

import apache_beam as beam

from beam_jobs.fingerprint import fp, unit
from beam_jobs.rank import LABEL_BUCKET_BITS, ExactRank, top_bucket
from beam_jobs.records import Image

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
    return min(s, n)


class _SplitStats(beam.CombineFn):
    """(split, Image) -> {split: [count, est_bytes, {label: count}]}."""

    def __init__(self, record_kind: str):
        self._kind = record_kind

    def create_accumulator(self):
        return {}

    def add_input(self, acc, element):
        split, im = element
        stats = acc.setdefault(split, [0, 0, {}])
        stats[0] += 1
        stats[1] += estimated_record_bytes(im, self._kind)
        stats[2][im.label] = stats[2].get(im.label, 0) + 1
        return acc

    def merge_accumulators(self, accs):
        out = {}
        for acc in accs:
            for split, (n, b, labels) in acc.items():
                stats = out.setdefault(split, [0, 0, {}])
                stats[0] += n
                stats[1] += b
                for label, c in labels.items():
                    stats[2][label] = stats[2].get(label, 0) + c
        return out

    def extract_output(self, acc):
        return acc


class PlanShards(beam.PTransform):
    """(split, Image) -> one dict: {split: {num_examples, est_bytes, num_shards, label_counts,
    label_offsets}}.

    Every split named in ``splits`` appears, empty ones with zero shards.
    """

    def __init__(
        self,
        splits: tuple[str, ...],
        record_kind: str,
        target_shard_mb: float,
        shard_multiple: int,
        num_shards: int | None,
    ):
        super().__init__()
        self._splits = splits
        self._kind = record_kind
        self._target = target_shard_mb * 1e6
        self._multiple = shard_multiple
        self._fixed = num_shards

    def expand(self, split_images):
        def plan(stats):
            out = {}
            for split in sorted(set(self._splits) | set(stats)):
                n, est, labels = stats.get(split, (0, 0, {}))
                label_counts = dict(sorted(labels.items()))
                offsets = itertools.accumulate(label_counts.values(), initial=0)
                out[split] = {
                    "num_examples": n,
                    "est_bytes": est,
                    "num_shards": shard_count(n, est, self._target, self._multiple, self._fixed),
                    "label_counts": label_counts,
                    # where each label starts when labels are laid end to end (balance=label)
                    "label_offsets": dict(zip(label_counts, offsets)),
                }
            return out

        return (
            split_images
            | "Stats" >> beam.CombineGlobally(_SplitStats(self._kind))
            | "Plan" >> beam.Map(plan)
        )


class OrderAndShard(beam.PTransform):
    """(split, Image) -> ((split, shard), (sort_key, Image)), given the plan side input."""

    def __init__(self, seed: int, balance: str, plan):
        super().__init__()
        self._seed = seed
        self._balance = balance
        self._plan = plan

    def expand(self, split_images):
        seed = self._seed
        plan = beam.pvalue.AsSingleton(self._plan)
        if self._balance == "none":

            def to_rank(element):
                split, im = element
                r = fp(seed, "order", im.key)
                return split, r, top_bucket(r), im

            def to_shard(ranked, plan):
                split, rank, total, im = ranked
                shards = plan[split]["num_shards"]
                return (split, rank * shards // total), (rank, im)

            return (
                split_images
                | "OrderKey" >> beam.Map(to_rank)
                # (split, rank, split size, Image)
                | "GlobalRank" >> ExactRank()
                | "ShardOfRank" >> beam.Map(to_shard, plan)
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
            sort_key = (position, fp(seed, "order", im.key))
            return (split, (offset + i) % info["num_shards"]), (sort_key, im)

        return (
            split_images
            | "OrderKeyByLabel" >> beam.Map(to_label_rank)
            # ((split, label), rank within label, label count, Image)
            | "RankInLabel" >> ExactRank()
            | "DealToShards" >> beam.Map(to_balanced_shard, plan)
        )
