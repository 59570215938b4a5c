"""TFRecord framing: the bytes of one record, and a checking reader.

A record is: uint64 length, masked CRC-32C of the length, the data, masked
CRC-32C of the data (all little-endian). ``.gz`` files are one gzip stream.
The reader here checks every CRC and says which record of which file is bad,
which TensorFlow's own reader does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import zlib
from collections.abc import Iterator

from schemas.errors import Error, InvalidValueError
from schemas.storage import open_binary

_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(record))
    return b"".join(
        [
            length,
            struct.pack("<I", masked_crc(length)),
            record,
            struct.pack("<I", masked_crc(record)),
        ]
    )


FRAME_OVERHEAD = 16  # length, its CRC, and the data's CRC
_HEADER = 12  # length and its CRC


def unframe(record_frame: bytes, path: str, index: int, offset: int) -> bytes:
    """The data of one whole framed record (as a DALI index locates it), every
    part checked: the length and both CRCs.

    Raises:
        CorruptRecord: naming the file, the record and its byte offset.
    """
    if len(record_frame) < FRAME_OVERHEAD:
        raise CorruptRecord(path, index, offset, "file ends inside a record")
    length = _length(record_frame[:_HEADER], path, index, offset)
    if length != len(record_frame) - FRAME_OVERHEAD:
        raise CorruptRecord(path, index, offset, "record length differs from its index entry")
    return _data(record_frame[_HEADER:], length, path, index, offset)


def _length(header: bytes, path: str, index: int, offset: int) -> int:
    """A record's data length, from its 12-byte header (length, masked CRC of it)."""
    length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
    if masked_crc(length_bytes) != length_crc:
        if offset == 0 and header.startswith(b"\x1f\x8b") and not path.endswith(".gz"):
            problem = "the file is gzip-compressed: name it *.gz (TFRecordWriter's GZIP option)"
            raise NotRecords(path, index, offset, problem)
        raise CorruptRecord(path, index, offset, "length checksum mismatch")
    return struct.unpack("<Q", length_bytes)[0]


def _data(body: bytes, length: int, path: str, index: int, offset: int) -> bytes:
    """A record's data, from what follows its header (the data, masked CRC of it)."""
    if len(body) < length + 4:
        raise CorruptRecord(path, index, offset, "file ends inside a record")
    data, (data_crc,) = body[:length], struct.unpack("<I", body[length : length + 4])
    if masked_crc(data) != data_crc:
        raise CorruptRecord(path, index, offset, "data checksum mismatch")
    return data


def index_text(lengths) -> bytes:
    """DALI's index of an uncompressed file of records of these lengths: one
    ``offset size`` line a record, exactly as DALI's ``tfrecord2idx`` writes it."""
    lines, offset = [], 0
    for n in lengths:
        size = n + FRAME_OVERHEAD
        lines.append(f"{offset} {size}\n")
        offset += size
    return "".join(lines).encode("ascii")


def parse_index(text: bytes, num_records: int, file_size: int, where: str):
    """A DALI index as an int64 array [[offset, size]], checked to describe its shard
    exactly: ``num_records`` lines of two whole numbers, each record starting where
    the one before ends, from 0 to ``file_size``. A duplicated, missing or edited
    line would make a reader yield a record twice, skip one or read garbage.

    Checked with numpy (readers check every shard's index when they are built);
    a table that fails is read again line by line, to name the first wrong line.

    Raises:
        ValueError: naming ``where`` and the first line that is wrong.
    """
    import numpy as np

    lines = text.splitlines()
    if len(lines) != num_records:
        raise InvalidValueError(
            f"{where}: {len(lines)} records indexed, dataset_info.json lists {num_records}"
        )
    try:
        table = np.array(text.split(), np.int64).reshape(num_records, 2)
    except ValueError:
        table = None
    if table is not None and num_records:
        offsets, sizes = table[:, 0], table[:, 1]
        ends = np.cumsum(sizes)
        follows = offsets[0] == 0 and np.array_equal(offsets[1:], ends[:-1])
        if follows and (sizes > FRAME_OVERHEAD).all() and ends[-1] == file_size:
            return table
    _name_the_wrong_line(lines, file_size, where)
    return table  # no records and an empty shard


def _name_the_wrong_line(lines: list[bytes], file_size: int, where: str) -> None:
    """Raises ValueError for the first line of an index that does not describe its shard."""
    end = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.decode("ascii", errors="replace")
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise InvalidValueError(f"{where}: line {number} is not 'offset size': {line[:40]!r}")
        offset, size = int(parts[0]), int(parts[1])
        if offset != end or size <= FRAME_OVERHEAD:
            raise InvalidValueError(
                f"{where}: line {number} ({offset} {size}) does not follow the record "
                f"before it (which ends at byte {end})"
            )
        end = offset + size
    if end != file_size:
        raise InvalidValueError(
            f"{where}: the records indexed end at byte {end}, the shard at {file_size}"
        )


class CorruptRecord(Error, ValueError):
    """A record whose framing or checksum is wrong; says which one."""

    def __init__(self, path: str, index: int, offset: int, problem: str):
        super().__init__(f"{path}: record {index} (byte {offset}): {problem}")
        self.path, self.index, self.offset, self.problem = path, index, offset, problem

    def __reduce__(self):  # rebuilt from its four values (its message is made of them)
        return type(self), (self.path, self.index, self.offset, self.problem)


class NotRecords(CorruptRecord):
    """A file that is no TFRecord file at all (a gzip stream not named ``.gz``): no
    record in it can be read, so reading past damage does not look for one."""


class HashingReader:
    """Wraps a stream: sha256 and byte count of everything read through it."""

    def __init__(self, stream):
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        """Reads to the end, so the hash and count cover the whole file."""
        while self.read(1 << 20):
            pass


# Compressed bytes fed to zlib at once: what a damaged piece costs to feed again a
# byte at a time (about 0.1 s once a damaged file), never what is kept.
_PIECE = 1 << 16


class _GunzipReader:
    """A streaming gunzip with ``read(n)`` (the gzip module needs seekable input), fed
    ``_PIECE`` bytes at a time. Damage keeps what came out before it: a piece zlib
    fails on is fed again a byte at a time from before it, so every byte zlib gave
    before the failing one is read first, the same bytes wherever the pieces fall; the
    error is raised by the read those bytes cannot satisfy."""

    def __init__(self, stream):
        self._stream = stream
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._buf = b""
        self._pos = 0  # of the next byte of _buf to read
        self._read_any = self._ended = self._cut = False
        self._error: zlib.error | None = None

    def read(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n and self._more():
            pass
        end = min(self._pos + n, len(self._buf))
        if self._error is not None and end - self._pos < n:
            raise self._error
        if self._cut and end == self._pos:
            # cut short where a record ended: no gzip trailer (a zero-byte file is
            # no stream, and holds no records)
            raise zlib.error("the file ends inside the gzip stream")
        out = self._buf[self._pos : end]
        self._pos = end
        return out

    def _more(self) -> bool:
        """Decompresses the next piece onto the buffer; False at the end or after damage."""
        if self._ended or self._error is not None:
            return False
        piece = self._stream.read(_PIECE)
        if not piece:
            self._ended = True
            self._add(self._z.flush())
            self._cut = self._read_any and not self._z.eof
            return False
        self._read_any = True
        before = self._z.copy()
        try:
            self._add(self._z.decompress(piece))
        except zlib.error as e:
            self._error, out, view = e, bytearray(), memoryview(piece)
            for i in range(len(piece)):  # the same piece from before it, a byte at a time
                try:
                    out += before.decompress(view[i : i + 1])
                except zlib.error:
                    break
            self._add(bytes(out))
        return True

    def _add(self, data: bytes) -> None:
        self._buf, self._pos = self._buf[self._pos :] + data, 0


def iter_records(path: str, raw=None) -> Iterator[bytes]:
    """Yields the records of a TFRecord file, checking every CRC.

    Args:
        path: the file (``.gz``: one gzip stream); named in errors.
        raw: an open stream of the file's stored bytes to read instead of
            opening ``path`` (the caller closes it).

    Raises:
        CorruptRecord: a truncated record or a checksum mismatch, naming the
            record index and byte offset (in the uncompressed stream).
    """
    return (data for _, data in records_at(path, raw))


def records_at(path: str, raw=None) -> Iterator[tuple[int, bytes]]:
    """``iter_records``, each record with its byte offset (in the uncompressed stream)."""
    return records_and_damage(path, raw, resync=False)  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class LostStretch:
    """Bytes ``[start, end)`` of a file (of its uncompressed stream) that hold no
    readable record: damage read past. ``end`` None: the rest of the file."""

    index: int | None  # of the record due at ``start``; None past damage that hides it
    start: int
    end: int | None
    problem: str  # why the record at ``start`` could not be read
    # whether the stretch held exactly one record: its length's CRC held and the next
    # record starts where that length ends (only its data was damaged); else how many
    # it held cannot be known, nor the index of any record after it
    one_record: bool = False

    def describe(self) -> str:
        """One phrase: where reading stopped, why, and where it went on."""
        where = f"byte {self.start}"
        where = where if self.index is None else f"record {self.index} ({where})"
        if self.end is None:
            return f"{where}: {self.problem}; no record follows"
        return (
            f"{where}: {self.problem}; bytes {self.start} to "
            f"{self.end - 1} ({self.end - self.start} bytes) hold no readable record and were "
            f"skipped, reading went on at the record at byte {self.end}"
        )


def records_and_damage(
    path: str, raw=None, resync: bool = True
) -> Iterator[tuple[int, bytes] | LostStretch]:
    """The records of a TFRecord file, each ``(byte offset, data)``, every CRC checked;
    with ``resync``, damage is read past: each damaged stretch is one ``LostStretch``,
    and reading goes on at the next place where a whole record's length and data
    CRCs both hold (a false match is a 1 in 2**64 event; nothing short of a record
    written whole is taken). Damage to a gzip stream itself ends the file (nothing
    after it can be decompressed).

    Raises:
        CorruptRecord: without ``resync``, at the first damage; with it, only for a
            damaged gzip stream.
    """
    stream = raw if raw is not None else open_binary(path)
    f = _Pushback(_GunzipReader(stream) if path.endswith(".gz") else stream)
    index = offset = 0
    counted = True  # whether ``index`` is known (no damage before that hid how many it held)
    try:
        while True:
            header, body, length = f.read(_HEADER), b"", None
            if not header:
                return
            try:
                if len(header) < _HEADER:
                    raise CorruptRecord(path, index, offset, "file ends inside a record header")
                length = _length(header, path, index, offset)
                body = f.read(length + 4)
                data = _data(body, length, path, index, offset)
            except CorruptRecord as e:
                if not resync or isinstance(e, NotRecords):
                    raise
                f.unread(header[1:] + body)
                skipped = _next_record(f)
                end = None if skipped is None else offset + 1 + skipped
                one = length is not None and end == offset + length + FRAME_OVERHEAD
                yield LostStretch(index if counted else None, offset, end, e.problem, one)
                counted = counted and one
                if end is None:
                    return
                index, offset = index + 1, end
                continue
            yield offset, data
            index += 1
            offset += length + FRAME_OVERHEAD
    except zlib.error as e:
        raise CorruptRecord(path, index, offset, f"gzip stream is damaged: {e}") from None
    finally:
        if raw is None:
            stream.close()


class _Pushback:
    """A stream with ``unread``: bytes given back are read again first."""

    def __init__(self, stream):
        self._stream = stream
        self._back, self._at = b"", 0  # bytes given back; the first not read again

    def read(self, n: int) -> bytes:
        if self._at == len(self._back):
            return self._stream.read(n)
        out = self._back[self._at : self._at + n]  # a place kept: no copy of the rest
        taken = len(out)
        if taken < n:
            out += self._stream.read(n - taken)  # (an error here gives nothing back)
        self._at += taken
        return out

    def unread(self, data: bytes) -> None:
        self._back, self._at = data + self._back[self._at :], 0


# Bytes read at a time while looking for the next whole record after damage.
_SCAN_PIECE = 1 << 16


def _next_record(f: _Pushback) -> int | None:
    """Reads ``f`` up to the next place a whole record starts (its length's CRC and its
    data's CRC both hold), leaves that record unread and returns how many bytes came
    before it; None (everything read) when no record follows. Holds at most a piece of
    what it scanned, and a candidate's record."""
    window = bytearray()
    ended = False

    def holds(n: int) -> bool:  # reads until the window holds n bytes, or the file ends
        nonlocal ended
        while not ended and len(window) < n:
            try:
                piece = f.read(max(n - len(window), _SCAN_PIECE))
            except zlib.error:  # damaged gzip ahead: what comes out before it, as needed
                piece = f.read(n - len(window))
            window.extend(piece)
            ended = not piece
        return len(window) >= n

    def whole_record_at(p: int) -> bool:  # its length's CRC and its data's CRC hold
        if masked_crc(bytes(window[p : p + 8])) != struct.unpack_from("<I", window, p + 8)[0]:
            return False
        data_end = p + _HEADER + struct.unpack_from("<Q", window, p)[0]
        return (
            holds(data_end + 4)
            and masked_crc(bytes(window[p + _HEADER : data_end]))
            == struct.unpack_from("<I", window, data_end)[0]
        )

    import numpy as np

    scanned = i = 0  # bytes dropped from the window; the first place not looked at
    while holds(i + _HEADER):
        end = len(window) - _HEADER + 1  # the places whose header the window holds
        # a length's top three bytes are 0 below 2**40 bytes, and a header is never 12
        # zero bytes (the CRC of a zero length is not 0): most places fail there, found
        # without a loop in Python (a damaged 4 MB stretch: 2.7 s a byte at a time; a
        # zeroed one is skipped whole)
        held = np.frombuffer(bytes(window[i : end + _HEADER - 1]), np.uint8)
        zero = held == 0
        tops = zero[5 : 5 + end - i] & zero[6 : 6 + end - i] & zero[7 : 7 + end - i]
        nonzero = np.concatenate([[0], np.cumsum(~zero)])
        tops &= nonzero[_HEADER : _HEADER + end - i] > nonzero[: end - i]
        for place in (np.flatnonzero(tops) + i).tolist():
            if whole_record_at(place):
                f.unread(bytes(window[place:]))
                return scanned + place
        i = end
        if i >= _SCAN_PIECE:
            del window[:i]
            scanned, i = scanned + i, 0
    return None
