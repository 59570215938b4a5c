"""WriteShards: one TFRecord file per (split, shard), written to a temp name and renamed.

The writer reads each image's bytes again (only metadata went through the
shuffle), checks they are the bytes inspected (size, and the CRC-32 taken
then: an input rewritten meanwhile is a ``changed`` reject, left out of the
shard) and writes the shard's records (``convert_core.write``) through Beam's
FileSystems (gs:// and friends).
"""

from __future__ import annotations

import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs.dead_letters import SplitRejects
from beam_jobs.filesystems import FILES
from convert_core import paths
from convert_core.records import Image
from convert_core.write import Sink, read_again, shard_files, shard_info, write_records
from schemas import layout, tfrecord
from schemas.progress import Progress


class _WriteShard(beam.DoFn):
    """((split, shard), [Image] in order) -> shard info dict, and a ``changed`` Reject for
    each image whose bytes are not those inspected (left out of the shard; finalize
    then writes no dataset). The arguments: ``WriteShards``'."""

    def __init__(
        self,
        out: str,
        incomplete: str,
        kind: str,
        compression: str,
        root: str | None,
        fingerprints: bool,
        record_image: tuple | None,
    ):
        self._out, self._incomplete, self._root = out, incomplete, root
        self._fingerprints = fingerprints
        self._record_image = record_image
        self._kind, self._compression = kind, compression
        self._records = Metrics.counter("evenshard", "records_written")
        self._bytes = Metrics.counter("evenshard", "bytes_written")
        self._shards = Metrics.counter("evenshard", "shards_written")

    def setup(self):
        self._progress = Progress("write", "records")

    def process(self, element, plan, vocab, gate):
        (split, index), images = element
        if not gate["ok"]:  # too many rejects: finalize fails the job, write nothing
            return
        label_ids = {label: i for i, label in enumerate(vocab["labels"])}
        files = shard_files(
            split, index, plan[split]["num_shards"], self._compression, self._fingerprints
        )
        name, index_file, near_file = files
        # A unique temp name per attempt: retries and backup attempts never
        # share a half-written file; the rename makes the shard appear whole.
        tmp = f"{self._incomplete}/{name}.{uuid.uuid4().hex}"
        again = None
        if self._record_image:  # a record input's images, read again a shard at a time
            images_again, feature = self._record_image
            items = [
                (paths.full_source(self._root, im.source, im.key), im)
                for im in images
                if im.data is None  # else carried from inspection
            ]
            again = images_again(items, feature, self._incomplete)

        def image_bytes(source: str, im: Image) -> tuple[bytes, str | None]:
            if im.data is not None:  # carried from inspection
                return im.data, None
            return _read_again(source, im) if again is None else next(again)

        with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            sink = Sink(f, gzip=self._compression == "gzip")
            written = write_records(
                sink,
                images,
                image_bytes,
                self._root,
                label_ids,
                self._kind,
                self._fingerprints,
                self._progress,
            )
        # the record first: a file in place always has one (output.py removes,
        # after a run that died, the files these records name and no others)
        # (not empty: Beam's S3 filesystem cannot create an empty object, a multipart
        # upload of no parts, which S3 refuses)
        with FileSystems.create(f"{self._incomplete}/{name}{layout.OWNED_SUFFIX}") as f:
            f.write(name.encode() + b"\n")
        # the index and fingerprints land first: a shard in place always has them
        if index_file:
            self._beside(tmp, ".idx", tfrecord.index_text(written.lengths), index_file)
        if near_file:
            self._beside(tmp, layout.NEAR_SUFFIX, b"".join(written.near_lines), near_file)
        FileSystems.rename([tmp], [f"{self._out}/{name}"])
        self._records.inc(written.count)
        self._bytes.inc(sink.num_bytes)
        self._shards.inc()
        yield shard_info(split, index, files, sink, written, self._kind)
        yield from written.changed

    def _beside(self, tmp: str, suffix: str, data: bytes, name: str) -> None:
        """Writes a file that goes beside the shard, through a temp name."""
        with FileSystems.create(tmp + suffix) as f:
            f.write(data)
        FileSystems.rename([tmp + suffix], [f"{self._out}/{name}"])


def _read_again(path: str, im: Image) -> tuple[bytes, str | None]:
    """``read_again`` through Beam's FileSystems."""
    return read_again(FILES, path, im)


class WriteShards(beam.PTransform):
    """((split, shard), [Image] in order) -> {main: shard info dicts, rejects: the images
    that changed since inspection}.

    Shards of ``record_kind`` and ``compression`` into ``output_dir``, each written
    in ``incomplete_dir`` first; relative ``Image.source`` values are under
    ``source_root``; ``fingerprints``: each shard's near-duplicate fingerprints go
    beside it (``NAME.near``, ``schemas.near``); ``record_image``: a record input's
    (``images_again`` of its format, the image's feature): how a shard's records'
    images are read again.
    ``plan``, ``vocab`` and ``gate`` are side inputs (nothing is written unless the
    gate is ok).
    """

    def __init__(
        self,
        output_dir: str,
        incomplete_dir: str,
        record_kind: str,
        compression: str,
        source_root: str | None,
        *,
        fingerprints: bool = False,
        record_image: tuple | None = None,
        plan,
        vocab,
        gate,
    ):
        super().__init__()
        self._args = (
            output_dir,
            incomplete_dir,
            record_kind,
            compression,
            source_root,
            fingerprints,
            record_image,
        )
        self._plan, self._vocab, self._gate = plan, vocab, gate

    def expand(self, sharded):
        written = sharded | "WriteShard" >> beam.ParDo(
            _WriteShard(*self._args),
            beam.pvalue.AsSingleton(self._plan),
            beam.pvalue.AsSingleton(self._vocab),
            beam.pvalue.AsSingleton(self._gate),
        )
        return written | "SplitChanged" >> SplitRejects()
