"""Serialized records fetched by their offsets, without TensorFlow: ``Records(shards)``.

Convert writes a DALI index beside each uncompressed shard (one ``offset size`` line a
record), checked when the read is built (``reader.values.split_shards.load_index``), so
any record is one ``pread`` away: the Python faces and a resized read's lead fetch records
so.
A record's :class:`Place` is all a process needs to fetch it (``fetch``): the Python
route's workers fetch their records so, the reader sending places, not bytes.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from reader.values.split_shards import open_shard
from schemas import storage, tfrecord
from schemas.info import DatasetError


class Place(NamedTuple):
    """Where a record lies: its file (a shard, or the cache's local copy of a run of
    it), the file's listed size, the record's byte offset in the shard and framed size,
    its number in the shard, and the byte of the shard the file starts at."""

    path: str
    listed: int
    offset: int
    size: int
    number: int
    base: int = 0


def fetch(place: Place, fds: dict) -> bytes:
    """The data of the record at ``place``, checked (length and CRCs); ``fds``: the
    descriptors opened so far (path -> descriptor), a new one added."""
    path = place.path
    if storage.is_url(path):  # a lead from a bucket: one ranged request
        framed = storage.read_range(path, place.size, place.offset)
    else:
        if path not in fds:
            fds[path] = open_shard(path, place.listed)  # removed or replaced since?
        framed = os.pread(fds[path], place.size, place.offset - place.base)
    try:
        return tfrecord.unframe(framed, path, place.number, place.offset)
    except tfrecord.CorruptRecord as e:
        raise DatasetError(f"{e}: the shard is corrupt or truncated") from None


class Descriptors(OrderedDict):
    """``fetch``'s descriptors for a process that reads many shards: at most ``most``
    open, the least recently opened closed first; ``close()`` closes them all."""

    def __init__(self, most: int = 64):
        super().__init__()
        self.most = most

    def __setitem__(self, path, fd) -> None:
        super().__setitem__(path, fd)
        while len(self) > self.most:
            os.close(self.popitem(last=False)[1])

    def close(self) -> None:
        while self:
            os.close(self.popitem()[1])


class Records:
    """Records of some shards fetched by their DALI index: ``get(i)`` is record ``i``
    counting over the shards in order (each shard checked: length and CRCs)."""

    def __init__(self, shards: list[dict]):
        self._paths = [s["path"] for s in shards]
        self._tables = [s["table"] for s in shards]
        self._sizes = [s["num_bytes"] for s in shards]
        counts = [s["num_examples"] for s in shards]
        # each shard's first record, as a list: ``bisect`` finds a record's shard in a
        # fraction of numpy's per-call cost (a record's place is looked up per record)
        self._firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        self._fds: dict[str, int] = {}  # path -> an open descriptor, opened on first use
        self._copies: dict[int, list] = {}  # shard -> the cache's local copies (``use``)

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *_) -> None:
        fds, self._fds = self._fds, {}
        close = os.close if os is not None else None  # None: a generator closed at exit
        for fd in fds.values() if close else ():
            close(fd)

    def get(self, i: int) -> bytes:
        return self._get(i, self._fds)

    def where(self, i: int) -> tuple[str, int, int]:
        """(shard path, byte offset, framed size) of record ``i``."""
        f = bisect.bisect_right(self._firsts, i) - 1
        offset, size = self._tables[f][i - self._firsts[f]]
        return self._paths[f], int(offset), int(size)

    def use(self, copies) -> None:
        """Reads records from these local copies, (shard index, first record, end, path)
        each (a run's records, or a whole shard's), and closes the descriptors of every
        other copy (an evicted copy must not stay open)."""
        self._copies = {}
        for f, first, end, path in copies:
            base, size = span(self._tables[f], first, end)
            self._copies.setdefault(int(f), []).append((int(first), int(end), path, base, size))
        paths = {c[2] for copies in self._copies.values() for c in copies}
        for path in [p for p in self._fds if p not in paths]:
            os.close(self._fds.pop(path))

    def place(self, i: int) -> Place:
        """Where record ``i`` lies (a local copy of the cache's where ``use`` gave one)."""
        f = bisect.bisect_right(self._firsts, i) - 1
        r = i - self._firsts[f]
        offset, size = self._tables[f][r].tolist()
        path, base, listed = self._paths[f], 0, self._sizes[f]
        for first, end, copy, copy_base, copy_size in self._copies.get(f, ()):
            if first <= r < end:
                path, base, listed = copy, copy_base, copy_size
        return Place(path, listed, offset, size, r, base)

    def _get(self, i: int, fds: dict[str, int]) -> bytes:
        return fetch(self.place(i), fds)

    def many(self, ids) -> np.ndarray:
        """The records of ``ids``, as an object array of bytes (a chunk for tf.data).
        Fetched shard by shard (``ids`` sorted, the answer in their order), one shard
        open at a time: a chunk of a permutation touches most of a split's shards, and
        holding each open to the chunk's end ran out of descriptors at a few hundred.
        Safe from several threads at once (tf.data runs chunks in parallel): each call
        opens and closes its own descriptors."""
        ids = np.asarray(ids, np.int64)
        out = np.empty(len(ids), dtype=object)
        fds = Descriptors(most=1)
        try:
            for j in np.argsort(ids, kind="stable").tolist():
                out[j] = self._get(int(ids[j]), fds)
        finally:
            fds.close()
        return out


def span(table, start: int, stop: int) -> tuple[int, int]:
    """(offset, bytes) of records ``start`` to ``stop`` of a shard with DALI index ``table``."""
    if start >= stop:
        return 0, 0
    end = int(table[stop - 1][0]) + int(table[stop - 1][1])
    return int(table[start][0]), end - int(table[start][0])
