"""ReadRecordFiles: the records of record files (TFRecord, Parquet, WebDataset) as inputs
(issue 42), each one's image inspected as it is read. A format's module reads its
files (``tfrecord_source``, ``parquet_source``, ``webdataset_source``); what they
share is here.

Listing is one ``schemas.storage.match`` of the pattern, run in a worker: the driver
plans nothing per file (it reads one record, to choose the features). The files
are spread over workers in chunks, and each is read once, front to back. A
record's image is inspected as a file's is (``InspectImage.inspect_bytes``, the
same reject reasons) and only its metadata goes on, with where the record is in
its file (``Image.record``): the image bytes do not travel through the shuffle,
the writer reads the record again (the format's ``images_again``), but for a
bucket's small images (``carried``), whose second read would be a request. Damage is one
reject naming the file, the record and where; the records before it are inputs
as any others.
"""

from __future__ import annotations

import itertools
import zlib

import apache_beam as beam

from beam_jobs.dead_letters import SplitRejects
from beam_jobs.inspect_images import InspectImage
from beam_jobs.pass_through import record_facts
from beam_jobs.sources import chunked
from convert_core import paths
from convert_core.inspection import carried, open_error
from convert_core.record_rules import RecordFormat, RecordProblem, RecordRules
from convert_core.records import Candidate, make_reject
from schemas import storage
from schemas.images import Rejected


def record_files(fmt: RecordFormat, pattern: str, root: str, named_only: bool, limit=None):
    """The files of ``pattern`` in order; ``named_only`` (a folder): those ``fmt`` names
    its own (``RecordFormat.named``). A local folder's (``ROOT/**``) are walked
    (``paths.local_files``: no stat a file)."""
    if pattern == root + "/**" and not paths.is_url(root):
        files = sorted(itertools.islice(paths.local_files(root), limit))
    elif pattern == root + "/**":  # a bucket folder, its name no pattern
        files = [path for path, _ in storage.match("**", limit, folder=root)]
    else:
        files = [path for path, _ in storage.match(pattern, limit)]
    if named_only:
        files = [f for f in files if fmt.named(paths.relative_to(root, f) or f)]
    return files


class ReadRecordFile(beam.DoFn):
    """file path -> Image | Reject, one a record, and one Reject for damage. A format's
    subclass reads the file (``process``) and hands each record's features to
    ``record``."""

    def __init__(self, root: str, rules: RecordRules, inspect: tuple, scratch: str | None = None):
        self._root, self._rules, self._inspect_args = root, rules, inspect
        self._scratch = scratch  # the run's .incomplete/: a format may copy images there
        self._image = rules.features.image

    def setup(self):
        self._inspector = InspectImage(*self._inspect_args)
        self._inspector.setup()

    @property
    def inspector(self) -> InspectImage:
        """The inspection of the records' images (set up)."""
        return self._inspector

    def record(self, path: str, key: str, where: str, features, place: tuple[int, int], data=None):
        """A record's Image, or a Reject (``key``: ``FILE#INDEX``, ``where``: the record's
        place in words, ``features``: its features as ``parse_features`` gives them, or a
        callable giving them, ``place``: ``Image.record``, ``data``: the serialized
        record, which ``--record_kind example`` writes as it is)."""
        try:
            features = features() if callable(features) else features
            key = self._rules.key(features, key)
            label = self._rules.label(features)
            group = self._rules.group(features)
            candidate = Candidate(
                key, paths.compact_source(self._root, path, key), "", label, group=group
            )
            if self._image is None:  # --record_kind example: the record as it is, no image
                found = record_facts(data, hash_content=self._inspect_args[0].hash_content)
            else:
                image_bytes = self._rules.image_of(features, self._image)
                found = self._inspector.inspect_bytes(image_bytes)
        except (RecordProblem, Rejected) as p:
            return make_reject(key, path, p.reason, f"{where}: {p.detail}")
        except ValueError as e:  # not a record of the format
            return make_reject(key, path, "corrupt", f"{where}: {e}")
        image = self._inspector.image(candidate, found)._replace(record=place)
        return image._replace(data=carried(path, image_bytes)) if self._image else image

    def read_files(self, files: list[str]):
        """What ``process`` gives for each file of a chunk of the listing, in order; a
        format may read ahead (``tfrecord_source``: a bucket's small files, several in
        flight)."""
        for path in files:
            yield from self.process(path)

    @staticmethod
    def unreadable(key: str, path: str, where: str, e: OSError):
        """The Reject of a file that cannot be opened or read (BeamIOError is an OSError)."""
        r = open_error(e)
        return make_reject(key, path, r.reason, f"{where}: {r.detail}")


class _ReadChunk(beam.DoFn):
    """[file path] (a chunk of the listing) -> what ``reader`` (a ``ReadRecordFile``)
    gives for each file, in order: its ``read_files``."""

    def __init__(self, reader: ReadRecordFile):
        self._reader = reader

    def setup(self):
        self._reader.setup()

    def process(self, chunk: list[str]):
        inspector = self._reader.inspector
        for out in self._reader.read_files(chunk):
            yield from inspector.embedded(out)
        if inspector.embedder:  # --near_embedding: the chunk's last batch
            yield from inspector.embedder.flush()


class _KeepFirst(beam.DoFn):
    """(key, [Image]) -> the first in (file, place) order; the others ``duplicate_key``."""

    def __init__(self, root: str, place):
        self._root, self._place = root, place

    def process(self, element):
        _, images = element
        first, *others = sorted(images, key=lambda im: (im.source, im.record))
        yield first
        place = self._place
        for im in others:
            source = paths.full_source(self._root, im.source, im.key)
            where = paths.full_source(self._root, first.source, first.key)
            detail = f"{place(im.record)}: key also at {where} {place(first.record)}"
            yield make_reject(im.key, source, "duplicate_key", detail)


class ReadRecordFiles(beam.PTransform):
    """PBegin -> {main: Image, rejects: Reject, inputs: count of all inputs}.

    The records of the files of ``fmt`` that ``pattern`` matches (``named_only``: a
    folder's files the format names its own), read through ``rules``; keys and
    sources relative to ``root``; ``inspect``: ``InspectImage``'s arguments;
    ``scratch``: the run's ``.incomplete/`` folder (Parquet copies its images there).
    """

    def __init__(
        self, fmt: RecordFormat, pattern: str, root: str, named_only: bool, rules, inspect, scratch
    ):
        super().__init__()
        self._fmt, self._pattern, self._root, self._named_only = fmt, pattern, root, named_only
        self._rules, self._inspect, self._scratch = rules, tuple(inspect), scratch

    def expand(self, pbegin):
        fmt, root, named_only = self._fmt, self._root, self._named_only
        read = (
            pbegin
            | "Start" >> beam.Create([self._pattern])
            | "List" >> beam.FlatMap(lambda p: chunked(record_files(fmt, p, root, named_only)))
            | "SpreadFiles" >> beam.Reshuffle()
            | "Read"
            >> beam.ParDo(_ReadChunk(fmt.reader(root, self._rules, self._inspect, self._scratch)))
        )
        inputs = read | "CountInputs" >> beam.combiners.Count.Globally()
        split = read | "SplitRejects" >> SplitRejects()
        if self._rules.features.key is None:  # FILE#INDEX keys are unique
            return {"main": split["main"], "rejects": split["rejects"], "inputs": inputs}
        unique = (
            split["main"]
            | "KeyByKey" >> beam.Map(lambda im: (im.key, im))
            | "GroupByKey" >> beam.GroupByKey()
            | "KeepFirstOfKey" >> beam.ParDo(_KeepFirst(root, fmt.place))
            | "SplitDuplicates" >> SplitRejects()
        )
        rejects = (split["rejects"], unique["rejects"]) | "AllRejects" >> beam.Flatten()
        return {"main": unique["main"], "rejects": rejects, "inputs": inputs}


def as_inspected(data: bytes, im, where: str, what: str) -> tuple[bytes, str | None]:
    """The writer's second read of an image, checked against what inspection saw (its
    size and CRC): (data, None), or (data, "WHERE: WHAT is not the one inspected")."""
    if len(data) != im.num_bytes or zlib.crc32(data) != im.crc32:
        return data, f"{where}: {what} is not the one inspected"
    return data, None
