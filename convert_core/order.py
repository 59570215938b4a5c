"""The order: the global shuffle and exact balance of a split, given its plan
(``convert_core.plan_shards``).

Per split, r = fp(seed, "order", key). ``balance="none"``: exact global rank
of r (``convert_core.rank``), shard = floor(rank * S / N), and the shard keeps rank
order, so reading shards 0..S-1 in order replays one uniform permutation and
shard sizes differ by at most one.

``balance="label"``: labels are laid end to end (sorted by name), each in
fingerprint order, and dealt round-robin to the S shards. Shard sizes still
differ by at most one, and every shard holds floor or ceil of n_c / S of each
label c. Inside a shard, item i of label c sits at position (i + u) / n_c
(u from the fingerprint), so every window of consecutive records carries the
split's label mix.

Beam's ``OrderAndShard`` (``beam_jobs.order``) ranks over workers; ``shards_of``
orders a split held whole, in one process: the same shards.
"""

from __future__ import annotations

from convert_core.fingerprint import fp, unit
from convert_core.rank import ranked, ranked_bucket, sort_key
from convert_core.records import Image


def shard_of(rank: int, num_shards: int, total: int) -> int:
    """``balance="none"``: the shard of the image ranked ``rank`` of ``total``."""
    return rank * num_shards // total


def shards_reached(first: int, size: int, num_shards: int, total: int) -> range:
    """The shards that a rank bucket's ranks (``first`` on, ``size`` of them) reach: one,
    or a few for a bucket across a shard boundary."""
    last = first + size - 1
    return range(shard_of(first, num_shards, total), shard_of(last, num_shards, total) + 1)


def in_shard(split_plan: dict, shard: int, buckets: dict[int, list]) -> list[Image]:
    """``balance="none"``: the Images of ``shard`` in rank order, of the whole rank buckets
    that reach it (``buckets``: {bucket: [(r, Image)]}), each ranked as ExactRank ranks it
    (``split_plan``: the split's plan, its bucket table)."""
    shards, total = split_plan["num_shards"], split_plan["num_examples"]
    found = [
        (rank, im)
        for bucket, members in buckets.items()
        for rank, im in ranked_bucket(split_plan["buckets"][bucket][0], members)
        if shard_of(rank, shards, total) == shard
    ]
    found.sort(key=lambda item: item[0])
    return [im for _, im in found]


def balanced_place(
    seed: int, offset: int, i: int, n_label: int, num_shards: int, key: str
) -> tuple[int, tuple]:
    """``balance="label"``: (shard, sort key in it) of item ``i`` of the ``n_label`` of its
    label, which starts at ``offset`` when the split's labels are laid end to end."""
    position = (i + unit(seed, "jitter", key)) / n_label
    return (offset + i) % num_shards, (position, fp(seed, "order", key))


def in_order(items) -> list[Image]:
    """[(sort key, Image)] of a shard -> its Images in order."""
    return [im for _, im in sorted(items, key=sort_key)]


def shards_of(images: list[Image], seed: int, balance: str, split_plan: dict) -> list[list[Image]]:
    """The shards of one split's ``images``, each in its order, in one process."""
    count, total = split_plan["num_shards"], split_plan["num_examples"]
    if balance == "none":
        shards: list[list] = [[] for _ in range(count)]
        for rank, im in ranked([(fp(seed, "order", im.key), im) for im in images]):
            shards[shard_of(rank, count, total)].append(im)
        return shards
    keyed: list[list] = [[] for _ in range(count)]
    for label, offset in split_plan["label_offsets"].items():
        members = [(fp(seed, "order", im.key), im) for im in images if im.label == label]
        for i, im in ranked(members):
            shard, key = balanced_place(seed, offset, i, len(members), count, im.key)
            keyed[shard].append((key, im))
    return [in_order(items) for items in keyed]
