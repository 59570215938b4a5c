"""OrderAndShard: the global shuffle and exact balance, given the plan
(``beam_jobs.plan_shards``), by the rule of ``convert_core.order``, the ranks taken
over workers.
"""

from __future__ import annotations

import pickle

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.rank import ExactRank
from convert_core.fingerprint import fp
from convert_core.order import balanced_place, in_order, in_shard, shards_reached
from convert_core.rank import BUCKET_BITS, LABEL_BUCKET_BITS, top_bucket


def _to_shards(split, r, bucket, im, plan):
    """-> ((split, shard), (bucket, r, Image)) for every shard that the bucket's ranks
    reach (``shards_reached``)."""
    info = plan[split]
    first, size = info["buckets"][bucket]
    for shard in shards_reached(first, size, info["num_shards"], info["num_examples"]):
        yield (split, shard), (bucket, r, im)


# Items a batch that crosses the shuffle, and items a worker holds at most
# before it sends what it has.
BATCH = 512
MAX_HELD = 8192


class _Batches(beam.DoFn):
    """(split, Image) -> lists of up to BATCH of them, from one bundle.

    The step before ToShards waits for the plan (a side input), so its input is
    written out whole between the steps: as lists, a few hundred elements cross
    instead of one an image (Beam's cost per element: encode, hand over, decode).
    """

    def start_bundle(self):
        self._batch: list = []

    def process(self, element):
        self._batch.append(element)
        if len(self._batch) == BATCH:
            yield self._batch
            self._batch = []

    def finish_bundle(self):
        if self._batch:
            yield GlobalWindows.windowed_value(self._batch)
            self._batch = []


class _ToShardBatches(beam.DoFn):
    """[(split, Image)] -> ((split, shard), pickled [(bucket, r, Image)]).

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

    def process(self, elements, plan):
        for split, im in elements:
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
    ExactRank ranks it, and the shard keeps the ranks that fall in it (``in_shard``).
    """
    (split, shard), batches = element
    buckets: dict[int, list] = {}
    for batch in batches:
        for bucket, r, im in pickle.loads(batch):
            buckets.setdefault(bucket, []).append((r, im))
    return (split, shard), in_shard(plan[split], shard, buckets)


def _in_order(element):
    """((split, shard), [(sort_key, Image)]) -> ((split, shard), [Image] in order)."""
    shard, items = element
    return shard, in_order(items)


class OrderAndShard(beam.PTransform):
    """(split, Image) -> ((split, shard), [Image] in the shard's order), given the plan.

    ``balance="none"`` needs one shuffle of the images: a shard is a range of
    ranks, a bucket (rank.py) is one too, so each image goes straight to the
    shard its bucket's ranks reach (two for the few buckets across a shard
    boundary: ``S - 1`` of 4096 buckets a split) and is ranked there.
    ``plan``: PlanShards' (a side input). ``bucket_bits``: buckets a split,
    2**bits (tests use few, to cross boundaries often).
    """

    def __init__(self, seed: int, balance: str, plan, bucket_bits: int = BUCKET_BITS):
        super().__init__()
        self._seed = seed
        self._balance = balance
        self._plan = plan
        self._bits = bucket_bits

    def expand(self, split_images):
        seed = self._seed
        plan = beam.pvalue.AsSingleton(self._plan)
        if self._balance == "none":
            # the plan's bucket table (PlanShards with the seed) gives the ranks
            return (
                split_images
                | "Batch" >> beam.ParDo(_Batches())
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
            shard, key = balanced_place(seed, offset, i, n_label, info["num_shards"], im.key)
            return (split, shard), (key, im)

        return (
            split_images
            | "OrderKeyByLabel" >> beam.Map(to_label_rank)
            # ((split, label), rank within label, label count, Image)
            | "RankInLabel" >> ExactRank()
            | "DealToShards" >> beam.Map(to_balanced_shard, plan)
            | "GroupByShard" >> beam.GroupByKey()
            | "InOrder" >> beam.Map(_in_order)
        )
