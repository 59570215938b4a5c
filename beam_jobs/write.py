"""WriteShards: one TFRecord file per (split, shard), written to a temp name and renamed.

The writer reads each image's bytes again (only metadata went through the
shuffle), checks they are the bytes inspected (size, and the CRC-32 taken
then: an input rewritten meanwhile is a ``changed`` reject, left out of the
shard), builds a ``tf.train.Example``, serializes it deterministically and
frames it as TFRecord. Framing is done here rather than with
``tf.io.TFRecordWriter`` so that all IO goes through Beam's FileSystems (gs://
and friends) and the bytes are ours to pin: gzip output uses zlib's gzip
wrapper, whose header carries no timestamp.
"""

from __future__ import annotations

import hashlib
import uuid
import zlib

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs.dead_letters import SplitRejects
from beam_jobs.filesystems import read_bytes
from convert_core import paths
from convert_core.records import Image, Reject, make_reject
from schemas import inferred, layout, near, tfrecord
from schemas.example import encode_record, parse_features
from schemas.progress import Progress

# a shard info's counts of its examples' features (example kind), which finalize merges
# into the schema and leaves out of dataset_info.json
FEATURE_STATS = "feature_stats"


class _Sink:
    """Writes to a stream, optionally gzip-compressed, counting bytes and hashing them."""

    def __init__(self, stream, gzip: bool):
        self._stream = stream
        self._zip = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip else None
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def _out(self, data: bytes) -> None:
        if data:
            self._stream.write(data)
            self.sha256.update(data)
            self.num_bytes += len(data)

    def write(self, data: bytes) -> None:
        self._out(self._zip.compress(data) if self._zip else data)

    def finish(self) -> None:
        if self._zip:
            self._out(self._zip.flush())


def example_bytes(im: Image, label_id: int, record_kind: str, data: bytes | None) -> bytes:
    """The serialized tf.train.Example of one image."""
    return encode_record(
        record_kind,
        key=im.key,
        label=im.label,
        label_id=label_id,
        image_format=im.format,
        height=im.height,
        width=im.width,
        channels=im.channels,
        payload=data if record_kind == "image" else im.rel_path,
    )


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
        example_kind = self._kind == "example"  # the record as it is (beam_jobs.pass_through)
        stats: dict = {}  # its features, counted for the schema (schemas.inferred)
        name = layout.shard_name(split, index, plan[split]["num_shards"], self._compression)
        # A unique temp name per attempt: retries and backup attempts never
        # share a half-written file; the rename makes the shard appear whole.
        tmp = f"{self._incomplete}/{name}.{uuid.uuid4().hex}"
        label_counts: dict[str, int] = {}
        lengths: list[int] = []  # for the DALI index (a shard's metadata)
        near_lines: list[bytes] = []  # the fingerprints, with --dedupe near
        changed: list[Reject] = []
        count = 0
        again = None
        if self._record_image:  # a record input's images, read again a shard at a time
            images_again, feature = self._record_image
            items = [
                (paths.full_source(self._root, im.source, im.key), im)
                for im in images
                if im.data is None  # else carried from inspection
            ]
            again = images_again(items, feature, self._incomplete)
        with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            sink = _Sink(f, gzip=self._compression == "gzip")
            for im in images:
                data = None
                if self._kind != "path":
                    source = paths.full_source(self._root, im.source, im.key)
                    if im.data is not None:
                        data, problem = im.data, None
                    elif again is None:
                        data, problem = _read_again(source, im)
                    else:
                        data, problem = next(again)
                    if problem:
                        changed.append(make_reject(im.key, source, "changed", problem))
                        continue
                if example_kind:
                    record = data
                    inferred.add(stats, parse_features(data))
                else:
                    record = example_bytes(im, label_ids[im.label], self._kind, data)
                sink.write(tfrecord.frame(record))
                lengths.append(len(record))
                if self._fingerprints:
                    near_lines.append(near.sidecar_line(im.key, im.near))
                if im.label:  # "": an example without --label_feature
                    label_counts[im.label] = label_counts.get(im.label, 0) + 1
                count += 1
                self._progress.add()
            sink.finish()
        # the record first: a file in place always has one (output.py removes,
        # after a run that died, the files these records name and no others)
        # (not empty: Beam's S3 filesystem cannot create an empty object, a multipart
        # upload of no parts, which S3 refuses)
        with FileSystems.create(f"{self._incomplete}/{name}{layout.OWNED_SUFFIX}") as f:
            f.write(name.encode() + b"\n")
        index_file = layout.index_name(name)
        # the index and fingerprints land first: a shard in place always has them
        if index_file:
            self._beside(tmp, ".idx", tfrecord.index_text(lengths), index_file)
        near_file = near.sidecar_name(name) if self._fingerprints else None
        if near_file:
            self._beside(tmp, layout.NEAR_SUFFIX, b"".join(near_lines), near_file)
        FileSystems.rename([tmp], [f"{self._out}/{name}"])
        self._records.inc(count)
        self._bytes.inc(sink.num_bytes)
        self._shards.inc()
        yield {
            "split": split,
            "index": index,
            "file": name,
            **({"dali_index": index_file} if index_file else {}),
            **({"near": near_file} if near_file else {}),
            "num_examples": count,
            "num_bytes": sink.num_bytes,
            "sha256": sink.sha256.hexdigest(),
            "label_counts": dict(sorted(label_counts.items())),
            **({FEATURE_STATS: stats} if example_kind else {}),
        }
        yield from changed

    def _beside(self, tmp: str, suffix: str, data: bytes, name: str) -> None:
        """Writes a file that goes beside the shard, through a temp name."""
        with FileSystems.create(tmp + suffix) as f:
            f.write(data)
        FileSystems.rename([tmp + suffix], [f"{self._out}/{name}"])


def _read_again(path: str, im: Image) -> tuple[bytes, str | None]:
    """The image's bytes, and what changed since inspection (None: nothing)."""
    try:
        data = read_bytes(path, im.num_bytes + 1)  # one more: a file that grew is caught
    except FileNotFoundError:
        return b"", "the file was removed after it was inspected"
    if len(data) != im.num_bytes:
        return data, f"{im.num_bytes} bytes when inspected, {len(data)} when written"
    if im.crc32 is not None and zlib.crc32(data) != im.crc32:
        return data, f"the same size ({im.num_bytes} bytes), other bytes than those inspected"
    return data, None


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
