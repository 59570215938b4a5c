"""Finalize: the end of ``convert``, once every shard and the rejects are written.

The description (``convert_core.describe``) written by ``convert_core.output.finish``:
``schema.pbtxt`` and ``labels.txt``, and ``dataset_info.json`` last. Its presence
means the dataset is complete; a run that fails or is killed leaves none, and
readers refuse such a directory. A run refused for its inputs writes the reason
instead (``convert_core.output.refuse``), which the driver raises
(``convert_core.options.DatasetRefused``).
"""

from __future__ import annotations

import apache_beam as beam

from convert_core.output import finish


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
