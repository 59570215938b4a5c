"""The steps that write the output folder, each thin over ``convert_core``:

- WriteRejects and RejectGate: every input that is not written, in one file
  (``rejects/rejects.jsonl``), and whether there are few enough of them for shards
  to be written (``convert_core.rejects``);
- WriteShards: one TFRecord file per (split, shard), written whole or not at all.
  The writer reads each image's bytes again (only metadata went through the
  shuffle), checks they are the bytes inspected (size, and the CRC-32 taken then:
  an input rewritten meanwhile is a ``changed`` reject, left out of the shard) and
  writes the shard (``convert_core.write.write_shard``);
- Finalize: once every shard and the rejects are written, the description
  (``schema.pbtxt``, ``labels.txt``, ``dataset_info.json`` last:
  ``convert_core.output.finish``), whose presence means the dataset is complete (a
  run that fails or is killed leaves none, and readers refuse such a folder); or,
  for a run refused for its inputs, the reason instead (``convert_core.output.refuse``,
  which the driver raises: ``convert_core.options.DatasetRefused``). The inputs that
  changed while shards were written are added to the rejects file then.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_jobs.dead_letters import SplitRejects
from convert_core import paths
from convert_core.output import finish, write_rejects
from convert_core.records import Image
from convert_core.rejects import gate, summary
from convert_core.write import Shards, read_again, write_shard
from schemas.progress import Progress


class _WriteShard(beam.DoFn):
    """((split, shard), [Image] in order) -> shard info dict, and a ``changed`` Reject for
    each image whose bytes are not those inspected (left out of the shard; finalize
    then writes no dataset). The arguments: ``WriteShards``'."""

    def __init__(self, shards: Shards, record_image: tuple | None):
        self._shards, self._record_image = shards, record_image
        self._records = Metrics.counter("evenshard", "records_written")
        self._bytes = Metrics.counter("evenshard", "bytes_written")
        self._shards_written = Metrics.counter("evenshard", "shards_written")

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
            root = self._shards.root
            items = [
                (paths.full_source(root, im.source, im.key), im)
                for im in images
                if im.data is None  # else carried from inspection
            ]
            again = images_again(items, feature, self._shards.incomplete)

        def image_bytes(source: str, im: Image) -> tuple[bytes, str | None]:
            if im.data is not None:  # carried from inspection
                return im.data, None
            return read_again(source, im) if again is None else next(again)

        num_shards = plan[split]["num_shards"]
        info, written = write_shard(
            self._shards, split, index, num_shards, images, image_bytes, label_ids, self._progress
        )
        self._records.inc(written.count)
        self._bytes.inc(info["num_bytes"])
        self._shards_written.inc()
        yield info
        yield from written.changed


class WriteShards(beam.PTransform):
    """((split, shard), [Image] in order) -> {main: shard info dicts, rejects: the images
    that changed since inspection}.

    Shards written as ``shards`` says (``convert_core.write.Shards``); ``record_image``:
    a record input's (``images_again`` of its format, the image's feature): how a
    shard's records' images are read again. ``plan``, ``vocab`` and ``gate`` are side
    inputs (nothing is written unless the gate is ok).
    """

    def __init__(self, shards: Shards, *, record_image: tuple | None = None, plan, vocab, gate):
        super().__init__()
        self._args = (shards, record_image)
        self._plan, self._vocab, self._gate = plan, vocab, gate

    def expand(self, sharded):
        written = sharded | "WriteShard" >> beam.ParDo(
            _WriteShard(*self._args),
            beam.pvalue.AsSingleton(self._plan),
            beam.pvalue.AsSingleton(self._vocab),
            beam.pvalue.AsSingleton(self._gate),
        )
        return written | "SplitChanged" >> SplitRejects()


class WriteRejects(beam.PTransform):
    """Reject -> one summary {reason: count}; writes ``rejects_file``.

    All rejects go to one file in one worker, sorted by (key, source, reason,
    detail). Rejects are few by construction
    (the job fails above --max_reject_fraction, default 1%), so this is the
    metadata of about one shard at worst.
    """

    def __init__(self, rejects_file: str):
        super().__init__()
        self._path = rejects_file

    def expand(self, rejects):
        path = self._path

        def write(all_rejects):
            write_rejects(path, all_rejects)
            return summary(all_rejects)

        return rejects | "AllRejects" >> beam.combiners.ToList() | "WriteFile" >> beam.Map(write)


class RejectGate(beam.PTransform):
    """PBegin -> {"ok", "inputs", "rejects", "max_fraction"}: may shards be written?"""

    def __init__(self, max_fraction: float, inputs, reject_summary):
        super().__init__()
        self._max = max_fraction
        self._inputs, self._summary = inputs, reject_summary

    def expand(self, pbegin):
        max_fraction = self._max

        def decide(_, inputs, reject_summary):
            return gate(max_fraction, inputs, reject_summary)

        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Decide"
            >> beam.Map(
                decide,
                beam.pvalue.AsSingleton(self._inputs),
                beam.pvalue.AsSingleton(self._summary),
            )
        )


class _Finalize(beam.DoFn):
    def __init__(self, output_dir: str, rejects_file: str, incomplete_dir: str, settings: dict):
        self._args = (output_dir, incomplete_dir, rejects_file, settings)

    def process(self, _, shards, plan, vocab, gate, reject_summary, changed, near):
        info = finish(*self._args, shards, plan, vocab, gate, reject_summary, changed, near)
        if info is not None:
            yield info


class Finalize(beam.PTransform):
    """PBegin -> the dataset_info dict, once every shard and the rejects are written; or
    no dataset (``refuse``): too many rejects, or inputs that changed while shards were
    written (``changed``: added to the rejects file).

    ``settings``: what the info records of the flags (``Job.settings``); the other
    arguments are the side inputs the info is made of (``near``: the summary of
    ``--dedupe near``, or None).
    """

    def __init__(
        self,
        output_dir: str,
        rejects_file: str,
        incomplete_dir: str,
        settings: dict,
        *,
        shards,
        changed,
        plan,
        vocab,
        gate,
        reject_summary,
        near=None,
    ):
        super().__init__()
        self._fn = _Finalize(output_dir, rejects_file, incomplete_dir, settings)
        self._side = (shards, plan, vocab, gate, reject_summary, changed, near)

    def expand(self, pbegin):
        shards, plan, vocab, gate, summary, changed, near = self._side
        if near is None:  # no --dedupe near: an empty list
            near = pbegin | "NoNear" >> beam.Create([])
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteInfo"
            >> beam.ParDo(
                self._fn,
                beam.pvalue.AsList(shards),
                beam.pvalue.AsSingleton(plan),
                beam.pvalue.AsSingleton(vocab),
                beam.pvalue.AsSingleton(gate),
                beam.pvalue.AsSingleton(summary),
                beam.pvalue.AsList(changed),
                beam.pvalue.AsList(near),
            )
        )
