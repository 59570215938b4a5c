"""The keys and image sizes of a shard's records, read by its DALI index without
reading an image: each record's map entries are walked by their lengths and only
the key and size features read (``reader.explain`` computes batches from them)."""

from __future__ import annotations

import os

import numpy as np

from reader.values.split_shards import open_shard
from schemas import features, storage
from schemas.dataset_info import DatasetInfo
from schemas.errors import InvalidValueError
from schemas.example import length_delimited, parse_example
from schemas.info import DatasetError

HEAD = 512  # bytes read from a record's start: every field before the image
_WANTED = {features.KEY.encode(), features.HEIGHT.encode(), features.WIDTH.encode()}


class ShardKeys:
    """The keys and image sizes of some shards' records (ids counted over the shards in
    order), each shard read once, when a record of it is first asked for."""

    def __init__(self, shards: list[dict], key: str = features.KEY):
        self.shards, self.key = shards, key  # key: the feature (records not images: theirs)
        counts = [s["num_examples"] for s in shards]
        self.firsts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.keys = np.full(int(self.firsts[-1]), "", object)
        self.sizes = np.zeros((int(self.firsts[-1]), 2), np.int64)  # height, width
        self.read = np.zeros(len(shards), bool)

    def of(self, ids: np.ndarray):
        """(keys, heights, widths) of records ``ids``."""
        files = np.searchsorted(self.firsts, ids, side="right") - 1
        for f in np.unique(files[~self.read[files]]):
            self.fill(int(f), *shard_keys(self.shards[f], self.key))
        return list(self.keys[ids]), self.sizes[ids, 0], self.sizes[ids, 1]

    def fill(self, f: int, keys, heights, widths) -> None:
        """Shard ``f``'s keys and sizes, read (or given)."""
        at = slice(int(self.firsts[f]), int(self.firsts[f + 1]))
        self.keys[at], self.sizes[at, 0], self.sizes[at, 1] = keys, heights, widths
        self.read[f] = True


def key_feature(info: DatasetInfo) -> str | None:
    """The feature a dataset's records hold their key in: ``key``; records that are not
    images (``record_kind`` example), the one convert's ``--key_feature`` named (None
    without one)."""
    return features.KEY if info.record_kind != "example" else info.key_feature


def shard_keys(shard: dict, key: str = features.KEY) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(keys, heights, widths) of a shard's records, read by its DALI index: the fields
    of each record but its image (which is skipped, never read)."""
    path, table = shard["path"], shard.get("table")
    if table is None:
        raise DatasetError(
            f"{path} has no DALI index (gzip): explain reads the keys by it; convert "
            "without --compression"
        )
    if storage.is_url(path):
        raise InvalidValueError(f"explain reads local shards: copy the dataset of {path} first")
    keys, heights, widths = [], np.zeros(len(table), np.int64), np.zeros(len(table), np.int64)
    fd = open_shard(path, shard["num_bytes"])
    try:
        for r, (offset, size) in enumerate(table):
            try:  # the record's data: after its 12-byte header, before its 4-byte CRC
                ex = parse_example(_fields(fd, int(offset) + 12, int(size) - 16, key))
                keys.append(ex[key].decode())
            except Exception as e:  # any damage: the record cannot be explained
                raise DatasetError(
                    f"{path}: record {r} (byte {offset}) has no readable key ({e}): the shard "
                    "is corrupt"
                ) from None
            heights[r], widths[r] = ex.get(features.HEIGHT) or 0, ex.get(features.WIDTH) or 0
    finally:
        os.close(fd)
    return keys, heights, widths


def _fields(fd: int, start: int, length: int, key: str = features.KEY) -> bytes:
    """A serialized tf.train.Example of the key and size features of the Example at
    ``start`` (``length`` bytes) of ``fd``: the map entries are walked by their lengths,
    and only the wanted ones read (the image's entry is jumped over)."""
    buf, at = b"", 0

    def need(pos: int, n: int) -> bytes:
        nonlocal buf, at
        if pos < at or pos + n > at + len(buf):
            buf, at = os.pread(fd, max(n, min(HEAD, length - pos)), start + pos), pos
        if pos + n > at + len(buf):
            raise InvalidValueError("the record ends inside a field")
        return buf[pos - at : pos - at + n]

    def varint(pos: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            byte = need(pos, 1)[0]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if byte < 0x80:
                return value, pos
            if shift > 63:
                raise InvalidValueError("a varint too long")

    if need(0, 1) != b"\x0a":
        raise InvalidValueError("not a tf.train.Example")
    body, pos = varint(1)
    end, kept = pos + body, []
    while pos < end:
        if need(pos, 1) != b"\x0a":
            raise InvalidValueError("not a feature map entry")
        size, entry = varint(pos + 1)
        if need(entry, 1) != b"\x0a":
            raise InvalidValueError("a feature without a name")
        named, name_at = varint(entry + 1)
        if need(name_at, named) in _WANTED | {key.encode()}:
            kept.append(need(pos, entry - pos + size))
        pos = entry + size
    return length_delimited(1, b"".join(kept))  # an Example of the kept map entries
