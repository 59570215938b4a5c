"""Finalize: the end of ``convert``, once every shard and the rejects are written.

The description (``convert_core.describe``) written through Beam's FileSystems:
``schema.pbtxt`` and ``labels.txt``, and ``dataset_info.json`` last. Its presence
means the dataset is complete; a run that fails or is killed leaves none, and
readers refuse such a directory. A run refused for its inputs writes the reason
instead (``refuse``), which the driver raises
(``convert_core.options.DatasetRefused``).
"""

from __future__ import annotations

import logging

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_jobs.filesystems import folder_files, write_atomically
from beam_jobs.rejects import add_rejects
from convert_core.describe import (
    check_counts,
    check_planned,
    dataset_files,
    dataset_info,
    inputs_changed,
    too_many_rejects,
)
from schemas.layout import REFUSED_FILE, join


def refuse(out: str, message: str) -> None:
    """Ends the run without a dataset: ``message`` (one line) for the driver to raise."""
    logging.info("evenshard: no dataset: %s", message)
    write_atomically(join(out, REFUSED_FILE), message.encode("utf-8"))


class _Finalize(beam.DoFn):
    def __init__(self, output_dir: str, rejects_file: str, incomplete_dir: str, settings: dict):
        self._out, self._rejects, self._incomplete = output_dir, rejects_file, incomplete_dir
        self._settings = settings

    def process(self, _, shards, plan, vocab, gate, reject_summary, changed, near):
        out, rejects_file = self._out, self._rejects
        if not gate["ok"]:
            refuse(out, too_many_rejects(gate, rejects_file))
            return
        info = dataset_info(
            self._settings, shards, plan, vocab, gate, reject_summary, near[0] if near else None
        )
        written = check_counts(info, gate, changed)
        if changed:  # the shards are one short each: no balanced dataset to declare
            add_rejects(rejects_file, changed)
            refuse(out, inputs_changed(changed, rejects_file))
            return
        check_planned(info, plan)
        for name, data in dataset_files(info, shards, vocab):  # dataset_info.json LAST
            write_atomically(join(out, name), data)
        # after the info, which now lists the shards: until then the records in
        # .incomplete/ say which files in the folder this run wrote
        incomplete = folder_files(self._incomplete)
        if incomplete:
            FileSystems.delete(incomplete)
        logging.info("evenshard: wrote %s examples to %s", written, out)
        yield info


class Finalize(beam.PTransform):
    """PBegin -> the dataset_info dict, once every shard and the rejects are written; or
    no dataset (``refuse``): too many rejects, or inputs that changed while shards were
    written (``changed``: added to the rejects file).

    ``settings``: what the info records of the flags (``convert_core.describe.settings``); the other
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
