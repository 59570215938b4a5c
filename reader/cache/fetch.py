"""Fetching one key of the bucket cache (``shard_cache``): a whole shard, checked by
its size and sha256, or a run of its records, fetched by ranged requests and
checked record by record (length and CRCs). Each returns None, or what was wrong
(the cache fetches once more, then names the shard)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable

from reader.records.record_offsets import span
from schemas import storage, tfrecord

RANGE_PIECE = 8 << 20  # bytes a run is fetched in at a time, at most (one request each)


def whole(shard: dict, out, count: Callable[[int], None]) -> str | None:
    """A whole shard into ``out``, checked by its size and sha256; ``count`` is told the
    bytes fetched."""
    checked = _Checked(out, shard["num_bytes"])
    with contextlib.suppress(_TooLarge):  # it stops the download there
        storage.download(shard["path"], checked)
    count(checked.size)
    if checked.over:
        return f"more bytes than the {shard['num_bytes']:,} listed fetched"
    if checked.size != shard["num_bytes"]:
        return f"{checked.size:,} bytes fetched, {shard['num_bytes']:,} listed"
    if "sha256" in shard and checked.digest.hexdigest() != shard["sha256"]:
        return "sha256 differs from the one listed"
    return None


def ranged(shard: dict, start: int, stop: int, out, count: Callable[[int], None]) -> str | None:
    """Records ``start`` to ``stop`` of a shard into ``out``, in ranged requests of
    ``RANGE_PIECE`` bytes at most (memory holds a piece and a record, not the run),
    checked by their size and each record's framing (length and CRCs); ``count`` is
    told the bytes of each request."""
    table = shard["table"]
    offset, size = span(table, start, stop)
    held, at, r = b"", offset, start  # bytes not yet checked, from offset ``at``
    for piece in range(offset, offset + size, RANGE_PIECE):
        want = min(RANGE_PIECE, offset + size - piece)
        data = storage.read_range(shard["path"], want, piece)
        count(len(data))
        if len(data) != want:
            got = piece - offset + len(data)
            return f"{got:,} bytes fetched of records {start}-{stop}, {size:,} listed"
        out.write(data)
        held += data
        while r < stop and int(table[r][0]) + int(table[r][1]) <= at + len(held):
            first, length = int(table[r][0]) - at, int(table[r][1])
            try:
                tfrecord.unframe(held[first : first + length], shard["path"], r, at + first)
            except tfrecord.CorruptRecord as e:
                return f"records {start}-{stop}: {e}"
            r += 1
        if r < stop:  # keep the record the next piece ends
            cut = int(table[r][0]) - at
            held, at = held[cut:], at + cut
        else:
            held, at = b"", at + len(held)
    return None


class _Checked:
    """A file being written, with the size and sha256 of what was written; it refuses to
    grow past ``limit`` bytes (the listed size, reserved against the cache's limit)."""

    def __init__(self, out, limit: int):
        self.out, self.limit, self.digest, self.size = out, limit, hashlib.sha256(), 0
        self.over = False  # the object holds more than ``limit`` bytes

    def write(self, chunk) -> int:
        if self.size + len(chunk) > self.limit:
            self.over = True
            raise _TooLarge
        self.digest.update(chunk)
        self.size += len(chunk)
        return self.out.write(chunk)


class _TooLarge(Exception):
    """The object holds more bytes than listed: its download stops there."""
