"""ReadRecordFiles: the records of TFRecord files as inputs (issue 42), each one's image
inspected as it is read; and the shard writer's second read of a record.

Listing is one ``FileSystems.match`` of the pattern, run in a worker: the driver
plans nothing per file (it reads one record, to choose the features). The files
are spread over workers in chunks, and each is read once, front to back, every
CRC checked (``schemas.tfrecord.records_at``). A record's image is inspected
as a file's is (``InspectImage.inspect_bytes``, the same reject reasons) and
only its metadata goes on, with the record's (byte offset, length): the image
bytes do not travel through the shuffle, the writer reads the record again
(``image_again``). Damage (a file cut short, a wrong CRC, a file that is no
TFRecord) is one reject naming the file, the record and its byte; the records
before it are inputs as any others.
"""

from __future__ import annotations

import zlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs import paths
from beam_jobs.dead_letters import SplitRejects
from beam_jobs.inspect_images import InspectImage, open_error
from beam_jobs.record_rules import RecordProblem, RecordRules, is_record_file
from beam_jobs.records import Candidate, Image, make_reject
from beam_jobs.sources import chunked
from schemas import tfrecord
from schemas.example import parse_features
from schemas.images import Rejected


def record_files(pattern: str, root: str, named_only: bool, limit: int | None = None) -> list:
    """The files of ``pattern`` in order; ``named_only`` (a folder): those whose names
    hold ``.tfrecord`` (``record_rules.is_record_file``)."""
    found = FileSystems.match([pattern], limits=[limit] if limit else None)[0].metadata_list
    files = sorted(m.path for m in found)
    if named_only:
        files = [f for f in files if is_record_file(paths.relative_to(root, f) or f)]
    return files


class _ReadRecordFile(beam.DoFn):
    """file path -> Image | Reject, one a record, and one Reject for damage."""

    def __init__(self, root: str, rules: RecordRules, inspect: tuple):
        self._root, self._rules, self._inspect_args = root, rules, inspect
        self._image = rules.features.image

    def setup(self):
        self._inspector = InspectImage(*self._inspect_args)
        self._inspector.setup()

    def process(self, path: str):
        rel = paths.relative_to(self._root, path) or path
        index = 0  # of the next record
        try:
            with paths.open_binary(path) as raw:
                for offset, data in tfrecord.records_at(path, raw):
                    yield self._record(path, rel, index, offset, data)
                    index += 1
        except tfrecord.CorruptRecord as e:
            reason = "truncated" if "ends inside" in e.problem else "corrupt"
            detail = (
                f"record {index} (byte {e.offset}): {e.problem}; the records before it are kept"
            )
            yield make_reject(f"{rel}#{index}", path, reason, detail)
        except OSError as e:  # BeamIOError is one
            r = open_error(e)
            yield make_reject(f"{rel}#{index}", path, r.reason, f"record {index}: {r.detail}")

    def _record(self, path: str, rel: str, index: int, offset: int, data: bytes):
        key, where = f"{rel}#{index}", f"record {index} (byte {offset})"
        try:
            features = parse_features(data)
            key = self._rules.key(features, key)
            label = self._rules.label(features)
            found = self._inspector.inspect_bytes(self._rules.image_of(features, self._image))
        except (RecordProblem, Rejected) as p:
            return make_reject(key, path, p.reason, f"{where}: {p.detail}")
        except ValueError as e:  # not a tf.train.Example
            return make_reject(key, path, "corrupt", f"{where}: {e}")
        candidate = Candidate(key, paths.compact_source(self._root, path, key), "", label)
        return self._inspector.image(candidate, found)._replace(record=(offset, len(data)))


class _KeepFirst(beam.DoFn):
    """(key, [Image]) -> the first in (file, offset) order; the others ``duplicate_key``."""

    def __init__(self, root: str):
        self._root = root

    def process(self, element):
        _, images = element
        first, *others = sorted(images, key=lambda im: (im.source, im.record))
        yield first
        for im in others:
            source = paths.full_source(self._root, im.source, im.key)
            where = paths.full_source(self._root, first.source, first.key)
            detail = f"byte {im.record[0]}: key also at {where} byte {first.record[0]}"
            yield make_reject(im.key, source, "duplicate_key", detail)


class ReadRecordFiles(beam.PTransform):
    """PBegin -> {main: Image, rejects: Reject, inputs: count of all inputs}.

    The records of the files ``pattern`` matches (``named_only``: a folder's
    ``*.tfrecord*`` files), read through ``rules``; keys and sources relative to
    ``root``; ``inspect``: ``InspectImage``'s arguments.
    """

    def __init__(self, pattern: str, root: str, named_only: bool, rules: RecordRules, inspect):
        super().__init__()
        self._pattern, self._root, self._named_only = pattern, root, named_only
        self._rules, self._inspect = rules, tuple(inspect)

    def expand(self, pbegin):
        pattern, root, named_only = self._pattern, self._root, self._named_only
        read = (
            pbegin
            | "Start" >> beam.Create([pattern])
            | "List" >> beam.FlatMap(lambda p: chunked(record_files(p, root, named_only)))
            | "SpreadFiles" >> beam.Reshuffle()
            | "Unchunk" >> beam.FlatMap(lambda chunk: chunk)
            | "Read" >> beam.ParDo(_ReadRecordFile(root, self._rules, self._inspect))
        )
        inputs = read | "CountInputs" >> beam.combiners.Count.Globally()
        split = read | "SplitRejects" >> SplitRejects()
        if self._rules.features.key is None:  # FILE#INDEX keys are unique
            return {"main": split["main"], "rejects": split["rejects"], "inputs": inputs}
        unique = (
            split["main"]
            | "KeyByKey" >> beam.Map(lambda im: (im.key, im))
            | "GroupByKey" >> beam.GroupByKey()
            | "KeepFirstOfKey" >> beam.ParDo(_KeepFirst(root))
            | "SplitDuplicates" >> SplitRejects()
        )
        rejects = (split["rejects"], unique["rejects"]) | "AllRejects" >> beam.Flatten()
        return {"main": unique["main"], "rejects": rejects, "inputs": inputs}


def image_again(path: str, im: Image, feature: str) -> tuple[bytes, str | None]:
    """The image of record ``im.record`` of ``path`` read again, and what changed since
    inspection (None: nothing). Uncompressed: one ranged read of the record;
    gzip: the file is decompressed up to it."""
    offset, length = im.record
    try:
        if path.endswith(".gz"):
            with paths.open_binary(path) as raw:
                data = next((d for o, d in tfrecord.records_at(path, raw) if o == offset), None)
            if data is None:
                return (
                    b"",
                    f"byte {offset}: the record is not the one inspected (none starts there)",
                )
        else:
            framed = paths.read_range(path, length + tfrecord.FRAME_OVERHEAD, offset)
            data = tfrecord.unframe(framed, path, -1, offset)
        image = RecordRules.image_of(parse_features(data), feature)
    except FileNotFoundError:
        return b"", "the file was removed after it was inspected"
    except (ValueError, RecordProblem) as e:  # CorruptRecord is a ValueError
        return b"", f"byte {offset}: the record is not the one inspected ({e})"
    if len(image) != im.num_bytes or zlib.crc32(image) != im.crc32:
        return image, f"byte {offset}: the record's image is not the one inspected"
    return image, None
