"""A shard's records: each image's bytes checked against what inspection saw, made into a
``tf.train.Example`` (``schemas.example``, serialized deterministically) and framed as
TFRecord (``schemas.tfrecord``), optionally gzip-compressed, counted and hashed.

Framing is done here rather than with ``tf.io.TFRecordWriter`` so that the bytes are
ours to pin and go to any stream (``write_shard``: ``schemas.storage.writer``'s, local
or a bucket's). Gzip output uses zlib's gzip wrapper, whose header carries no
timestamp.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from collections.abc import Callable

from convert_core.paths import full_source
from convert_core.records import Image, Reject, make_reject
from schemas import inferred, layout, near, storage, tfrecord
from schemas.example import encode_record, parse_features

# a shard info's counts of its examples' features (example kind), which finalize merges
# into the schema and leaves out of dataset_info.json
FEATURE_STATS = "feature_stats"


class Sink:
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


def read_again(path: str, im: Image) -> tuple[bytes, str | None]:
    """The image's bytes, and what changed since inspection (None: nothing)."""
    try:
        data = storage.read_range(path, im.num_bytes + 1)  # one more: a file that grew is caught
    except FileNotFoundError:
        return b"", "the file was removed after it was inspected"
    if len(data) != im.num_bytes:
        return data, f"{im.num_bytes} bytes when inspected, {len(data)} when written"
    if im.crc32 is not None and zlib.crc32(data) != im.crc32:
        return data, f"the same size ({im.num_bytes} bytes), other bytes than those inspected"
    return data, None


@dataclasses.dataclass
class Written:
    """What ``write_records`` wrote of a shard: its records' count, lengths (for the DALI
    index), labels, near-duplicate fingerprint lines, features (example kind) and the
    images left out because they changed since inspection."""

    count: int = 0
    lengths: list[int] = dataclasses.field(default_factory=list)
    label_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    near_lines: list[bytes] = dataclasses.field(default_factory=list)
    stats: dict = dataclasses.field(default_factory=dict)
    changed: list[Reject] = dataclasses.field(default_factory=list)


def write_records(
    sink: Sink,
    images: list[Image],
    image_bytes: Callable[[str, Image], tuple[bytes, str | None]],
    root: str | None,
    label_ids: dict[str, int],
    record_kind: str,
    fingerprints: bool,
    progress=None,
) -> Written:
    """Writes a shard's records to ``sink`` (finished here), in the order of ``images``.

    ``image_bytes(source, im)``: an image's bytes and what changed since inspection
    (None: nothing; else it is a ``changed`` reject, left out), asked in order, for
    every image but a path record's; relative sources are under ``root``;
    ``fingerprints``: each record's near-duplicate fingerprint line is kept;
    ``progress``: a ``schemas.progress.Progress`` told of each record.
    """
    written = Written()
    example_kind = record_kind == "example"  # the record as it is (beam_jobs.pass_through)
    for im in images:
        data = None
        if record_kind != "path":
            source = full_source(root, im.source, im.key)
            data, problem = image_bytes(source, im)
            if problem:
                written.changed.append(make_reject(im.key, source, "changed", problem))
                continue
        if example_kind:
            record = data
            inferred.add(written.stats, parse_features(data))
        else:
            record = example_bytes(im, label_ids[im.label], record_kind, data)
        sink.write(tfrecord.frame(record))
        written.lengths.append(len(record))
        if fingerprints:
            written.near_lines.append(near.sidecar_line(im.key, im.near))
        if im.label:  # "": an example without --label_feature
            written.label_counts[im.label] = written.label_counts.get(im.label, 0) + 1
        written.count += 1
        if progress is not None:
            progress.add()
    sink.finish()
    return written


def shard_files(
    split: str, index: int, num_shards: int, compression: str, fingerprints: bool
) -> tuple[str, str | None, str | None]:
    """(the shard's file name, its DALI index's or None, its fingerprints' or None)."""
    name = layout.shard_name(split, index, num_shards, compression)
    return name, layout.index_name(name), near.sidecar_name(name) if fingerprints else None


def shard_info(
    split: str,
    index: int,
    files: tuple[str, str | None, str | None],
    sink: Sink,
    written: Written,
    record_kind: str,
) -> dict:
    """A shard's entry in the info (``files``: ``shard_files``'), with its features' counts
    for finalize (example kind: ``FEATURE_STATS``)."""
    name, index_file, near_file = files
    return {
        "split": split,
        "index": index,
        "file": name,
        **({"dali_index": index_file} if index_file else {}),
        **({"near": near_file} if near_file else {}),
        "num_examples": written.count,
        "num_bytes": sink.num_bytes,
        "sha256": sink.sha256.hexdigest(),
        "label_counts": dict(sorted(written.label_counts.items())),
        **({FEATURE_STATS: written.stats} if record_kind == "example" else {}),
    }


@dataclasses.dataclass(frozen=True)
class Shards:
    """How a run's shards are written: into ``out``, a local one through a temp name in
    ``incomplete``; relative ``Image.source`` values under ``root``; records of
    ``record_kind`` and ``compression``; ``fingerprints``: each shard's near-duplicate
    fingerprints beside it (``NAME.near``, ``schemas.near``)."""

    out: str
    incomplete: str
    root: str | None
    record_kind: str
    compression: str
    fingerprints: bool = False

    @classmethod
    def of(cls, job) -> Shards:
        """A ``convert_core.job.Job``'s."""
        o = job.options
        near = o.dedupe == "near"
        return cls(
            job.output_dir, job.incomplete_dir, job.input_root, o.record_kind, o.compression, near
        )


def write_shard(
    shards: Shards,
    split: str,
    index: int,
    num_shards: int,
    images: list[Image],
    image_bytes: Callable[[str, Image], tuple[bytes, str | None]],
    label_ids: dict[str, int],
    progress=None,
) -> tuple[dict, Written]:
    """Writes one shard (``write_records``) and the files beside it into ``shards.out``,
    whole or not at all (``schemas.storage.writer``). Before the shard lands: a record
    of its name in ``shards.incomplete`` (``convert_core.output`` removes, after a run
    that died, the files these name and no others), then its DALI index and
    fingerprints, so a shard in place has them.

    Returns:
        (its entry in the info, what ``write_records`` wrote).
    """
    s = shards
    files = shard_files(split, index, num_shards, s.compression, s.fingerprints)
    name, index_file, near_file = files
    with storage.writer(layout.join(s.out, name), s.incomplete) as f:
        sink = Sink(f, gzip=s.compression == "gzip")
        written = write_records(
            sink, images, image_bytes, s.root, label_ids, s.record_kind, s.fingerprints, progress
        )
        owned = f"{s.incomplete}/{name}{layout.OWNED_SUFFIX}"
        storage.write_atomically(owned, name.encode() + b"\n")
        beside = [(index_file, tfrecord.index_text(written.lengths))]
        beside += [(near_file, b"".join(written.near_lines))]
        for file, data in beside:
            if file:
                with storage.writer(layout.join(s.out, file), s.incomplete) as g:
                    g.write(data)
    return shard_info(split, index, files, sink, written, s.record_kind), written
