"""The TFRecord files of tf.train.Example as inputs (issue 42): each file read once,
front to back, every CRC checked (``schemas.tfrecord.records_and_damage``), a
record's place its (byte offset, length), by which the writer reads it again
(``images_again``: a ranged read a record, a gzip file once a shard). Damage (a
file cut short, a wrong CRC or length, a file that is no TFRecord) is one reject a
damaged stretch, naming the file, the record and its bytes; reading goes on at the
next whole record after it (its length and data CRCs hold), so the records before
and after the damage are kept. What record formats
share: ``record_source``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import itertools

from beam_jobs.record_source import ReadRecordFile, as_inspected
from convert_core import paths
from convert_core.record_rules import RecordFormat, RecordProblem, RecordRules
from convert_core.records import Image, make_reject
from schemas import storage, tfrecord
from schemas.example import parse_features


class _ReadRecordFile(ReadRecordFile):
    """TFRecord file path -> Image | Reject, one a record, and one Reject for damage."""

    def process(self, path: str):
        return self._records(path, None)

    def read_files(self, files: list[str]):
        """A chunk's files in order; a bucket's read ahead, ``READS_IN_FLIGHT`` at once (its
        cost a small file is the request's latency, not the CPU: local files are read as
        the CPU gets to them)."""
        if not any(paths.is_url(f) for f in files):
            yield from super().read_files(files)
            return
        for path, head in zip(files, read_ahead(_head, files)):
            yield from self._records(path, head)

    def _records(self, path: str, head):
        """``process`` of ``path`` whose first bytes (``_head``) are the future ``head``,
        or None to read them here."""
        rel = paths.relative_to(self._root, path) or path
        index, at = 0, 0  # of the next record (None past damage that hides it), its byte

        def key() -> str:  # the next record's: its index, else (past such damage) its byte
            return f"{rel}#{index}" if index is not None else f"{rel}@{at}"

        def where() -> str:
            return f"record {index} (byte {at})" if index is not None else f"byte {at}"

        try:
            with _opened(path, head) as raw:
                for item in tfrecord.records_and_damage(path, raw):
                    if isinstance(item, tfrecord.LostStretch):
                        # one input a damaged stretch (it may have held several records):
                        # the inputs count what the file held, as far as it can be known
                        ends = item.end is None and "ends inside" in item.problem
                        reason = "truncated" if ends else "corrupt"
                        yield make_reject(key(), path, reason, item.describe())
                        index = index + 1 if index is not None and item.one_record else None
                        at = item.end
                        continue
                    at, data = item
                    features = functools.partial(parse_features, data)
                    place = (at, len(data))
                    yield self.record(path, key(), where(), features, place, data)
                    index = None if index is None else index + 1
                    at += len(data) + tfrecord.FRAME_OVERHEAD
        except tfrecord.CorruptRecord as e:  # the gzip stream itself, or no records at all
            reason = "truncated" if "ends inside" in e.problem else "corrupt"
            at = e.offset
            detail = f"{where()}: {e.problem}; the records before it are kept"
            yield make_reject(key(), path, reason, detail)
        except OSError as e:  # BeamIOError is one
            yield self.unreadable(key(), path, where(), e)


# A file up to this size is read in one call (from a bucket: one ranged request, where
# Beam's FileSystems.open makes several) and framed in memory, as inspection reads a
# loose image up to 1 MB: the one-example files of issue 42 (500 KB photos; the
# benchmark's are 2 KB), where an open stream's per-record reads cost more than their
# bytes. A larger file is read as a stream, a record at a time.
WHOLE_FILE = 1 << 20


# Reads of a bucket's objects a reader or writer has in flight at once: each costs the
# request's latency (tens of ms on a bucket), not the CPU. Four: 300 one-example files
# from the loopback server in 0.4 s against 1.0 one at a time; 8 or 16 took 1.4-3.4 s
# (a thread each in a Python server on the same cores, and the client's pool of 10).
READS_IN_FLIGHT = 4


def read_ahead(read, items, in_flight: int = READS_IN_FLIGHT):
    """The futures of ``read(item)`` of each item, in order, at most ``in_flight`` of them
    read at once in threads (and held: a future's result is the caller's to take)."""
    from concurrent.futures import ThreadPoolExecutor

    items = iter(items)
    with ThreadPoolExecutor(in_flight) as pool:
        first = itertools.islice(items, in_flight)
        pending = collections.deque(pool.submit(read, item) for item in first)
        while pending:
            done = pending.popleft()
            for item in itertools.islice(items, 1):
                pending.append(pool.submit(read, item))
            yield done


def _head(path: str) -> bytes:
    """The file's first ``WHOLE_FILE + 1`` bytes: all of it when it is small."""
    return storage.read_range(path, WHOLE_FILE + 1)


def _opened(path: str, head=None):
    """The stored bytes of ``path`` as a stream, from its start: in memory when the file
    is at most ``WHOLE_FILE`` bytes (one read), else the file opened. ``head``: the
    future of its ``_head``, read ahead."""
    head = _head(path) if head is None else head.result()
    if len(head) <= WHOLE_FILE:
        return contextlib.nullcontext(io.BytesIO(head))
    return storage.open_binary(path)


def _first(path: str) -> dict | None:
    with _opened(path) as raw:
        data = next(tfrecord.iter_records(path, raw), None)
    return None if data is None else parse_features(data)


def images_again(items: list[tuple[str, Image]], feature: str, scratch: str | None = None):
    """The images of a shard's records (``items``: (file, Image), ``im.record``: the
    record's (byte offset, length)) read again, in order: (bytes, what changed since
    inspection or None) each. Uncompressed: one ranged read a record; gzip: each file
    decompressed once, up to the last record the shard needs of it (those records
    held until written: at most a shard's). A bucket's ranged reads are read ahead,
    ``READS_IN_FLIGHT`` at once."""
    wanted: dict[str, set[int]] = {}
    for path, im in items:
        if path.endswith(".gz"):
            wanted.setdefault(path, set()).add(im.record[0])
    found = {path: _gzip_records(path, offsets) for path, offsets in wanted.items()}
    ranged = [item for item in items if _ranged_url(item[0])]
    ahead = read_ahead(_framed, ranged) if ranged else None
    for path, im in items:
        framed = next(ahead) if ahead and _ranged_url(path) else None
        yield _checked(path, im, feature, found.get(path), framed)


def _ranged_url(path: str) -> bool:
    return paths.is_url(path) and not path.endswith(".gz")


def _framed(item: tuple[str, Image]) -> bytes:
    """The framed record ``im.record`` of a file: one ranged read."""
    path, im = item
    offset, length = im.record
    return storage.read_range(path, length + tfrecord.FRAME_OVERHEAD, offset)


def image_again(path: str, im: Image, feature: str) -> tuple[bytes, str | None]:
    """``images_again`` of one record."""
    [got] = images_again([(path, im)], feature)
    return got


def _gzip_records(path: str, offsets: set[int]) -> dict:
    """The records of a gzip file that start at ``offsets``, read in one pass that ends at
    the last of them; the error that ended the pass, if any, under None."""
    got: dict = {}
    try:
        with storage.open_binary(path) as raw:
            for item in tfrecord.records_and_damage(path, raw):  # read past as inspection did
                if isinstance(item, tfrecord.LostStretch):
                    continue
                offset, data = item
                if offset in offsets:
                    got[offset] = data
                    if len(got) == len(offsets):
                        break
    except (OSError, ValueError) as e:  # CorruptRecord is a ValueError
        got[None] = e
    return got


def _checked(path: str, im: Image, feature: str, found: dict | None, framed=None):
    """(image, what changed or None) of record ``im.record`` of ``path``: from ``found``
    (a gzip file's, ``_gzip_records``), else one ranged read (``framed``: its future,
    read ahead)."""
    offset, length = im.record
    try:
        if found is None:
            framed = _framed((path, im)) if framed is None else framed.result()
            data = tfrecord.unframe(framed, path, -1, offset)
        elif offset in found:
            data = found.pop(offset)  # a record is read again once
        elif None in found:
            raise found[None]
        else:
            return b"", f"byte {offset}: the record is not the one inspected (none starts there)"
        # feature None (--record_kind example): the record itself, unparsed
        image = RecordRules.image_of(parse_features(data), feature) if feature else data
    except FileNotFoundError:
        return b"", "the file was removed after it was inspected"
    except (ValueError, RecordProblem) as e:  # CorruptRecord is a ValueError
        return b"", f"byte {offset}: the record is not the one inspected ({e})"
    return as_inspected(image, im, f"byte {offset}", "the record's image")


FORMAT = RecordFormat("tfrecord", "TFRecord", _ReadRecordFile, _first, images_again)
