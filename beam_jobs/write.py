"""WriteShards: one TFRecord file per (split, shard), written whole or not at all.

The writer reads each image's bytes again (only metadata went through the
shuffle), checks they are the bytes inspected (size, and the CRC-32 taken
then: an input rewritten meanwhile is a ``changed`` reject, left out of the
shard) and writes the shard (``convert_core.write.write_shard``).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_jobs.dead_letters import SplitRejects
from convert_core import paths
from convert_core.records import Image
from convert_core.write import read_again, write_shard
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
            return read_again(source, im) if again is None else next(again)

        info, written = write_shard(
            self._out,
            self._incomplete,
            split,
            index,
            plan[split]["num_shards"],
            images,
            image_bytes,
            root=self._root,
            label_ids=label_ids,
            record_kind=self._kind,
            compression=self._compression,
            fingerprints=self._fingerprints,
            progress=self._progress,
        )
        self._records.inc(written.count)
        self._bytes.inc(info["num_bytes"])
        self._shards.inc()
        yield info
        yield from written.changed


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
