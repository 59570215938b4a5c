"""Excluded keys the read's splits do not hold (a typo in a takedown list), named in
one warning once a process: ``read.resolve`` asks, below every face and ``explain``."""

from __future__ import annotations

import logging

from reader.front.shard_keys import key_feature, shard_keys
from reader.values.split_shards import load_index, split_fingerprint, split_shards
from schemas import storage
from schemas.info import DatasetError

log = logging.getLogger(__name__)
SHOWN_KEYS = 5  # excluded keys a warning names
# the most records whose keys are searched for the excluded ones: about 7 s a process
# start (ImageNet's 1.28M would hold up every start of every process for 90 s)
EXCLUDED_CHECKED_MOST = 100_000
# (the sources' splits, the excluded keys) looked for in this process: said once
_LOOKED_FOR: set[tuple] = set()


def warn_unheld(read) -> None:
    """Logs once a process, naming them, the keys the state excludes that no shard of
    the read's splits holds: they exclude nothing (a typo in a takedown list).
    ``read``: a ``reader.front.read.Read`` (not imported: read.py imports this module).

    Every record's key is read by the shards' DALI indexes (``shard_keys``: the images
    jumped over, about 14,000 records a second); a split whose shards have none (gzip)
    or lie in a bucket is not searched (every record read whole), nor one with a
    damaged record (the read stops there, or skips it), nor reads of more than
    ``EXCLUDED_CHECKED_MOST`` records (the search would hold up every start of every
    process), and then nothing is said.
    """
    if not read.excluded:
        return
    splits = tuple((s.info, s.data_dir, s.split) for s in read.sources)
    looked_for = (
        tuple((d, split, split_fingerprint(info, split)) for info, d, split in splits),
        tuple(sorted(read.excluded)),
    )
    if looked_for in _LOOKED_FOR:
        return
    _LOOKED_FOR.add(looked_for)
    left = set(read.excluded)
    every = [(shard, info) for info, d, split in splits for shard in split_shards(info, d, split)]
    if any(s["index"] is None or storage.is_url(s["path"]) for s, _ in every):
        return
    if sum(s["num_examples"] for s, _ in every) > EXCLUDED_CHECKED_MOST:
        return
    try:
        for shard, info in every:
            indexed = {**shard, "table": load_index(shard)}
            left.difference_update(shard_keys(indexed, key_feature(info))[0])
            if not left:
                return
    except DatasetError:  # a damaged record: the read stops naming it, or skips it
        return
    unheld = sorted(left)
    shown = ", ".join(repr(k) for k in unheld[:SHOWN_KEYS])
    more = f" and {len(unheld) - SHOWN_KEYS} more" if len(unheld) > SHOWN_KEYS else ""
    where = " or ".join(f"split {split!r} of {d}" for _, d, split in splits)
    log.warning(
        "excluded keys in no shard of %s (%d; they exclude nothing): %s%s; check them "
        "against the dataset's keys",
        where,
        len(unheld),
        shown,
        more,
    )
