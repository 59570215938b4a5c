"""Finalize: the end of ``convert``, once every shard and the rejects are written.

Order of appearance in the output directory: shards and ``rejects/`` first,
then ``schema.pbtxt`` and ``labels.txt``, and ``dataset_info.json`` last. Its
presence means the dataset is complete; a run that fails or is killed leaves
none, and readers refuse such a directory. A run refused for its inputs
writes the reason instead (``refuse``), which the driver raises
(``convert_core.options.DatasetRefused``).
"""

from __future__ import annotations

import json
import logging

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

import schemas
from beam_jobs.filesystems import folder_files, write_atomically
from beam_jobs.rejects import add_rejects
from beam_jobs.write import FEATURE_STATS
from convert_core.options import ConvertOptions
from schemas import inferred
from schemas.errors import OperationError
from schemas.layout import (
    FORMAT_VERSION,
    INFO_FILE,
    LABELS_FILE,
    REFUSED_FILE,
    REJECTS_FILE,
    SCHEMA_FILE,
    join,
)


def settings(options: ConvertOptions, path_root: str | None) -> dict:
    """What dataset_info.json records of how the dataset was made: the flags that shape
    it (``input`` as typed) and, for path records, the resolved path root."""
    recorded = {
        "format_version": FORMAT_VERSION,
        "record_kind": options.record_kind,
        "seed": options.seed,
        "balance": options.balance,
        "compression": options.compression,
        "verify": options.verify,
        "dedupe": options.dedupe,
        "input": options.input,
        "split_options": {
            "splits": dict(options.splits),
            "split_mode": options.split_mode,
            "split_seed": options.split_seed,
            "group_by": options.group_by,
        },
        "shard_options": {
            "target_shard_mb": options.target_shard_mb,
            "num_shards": options.num_shards,
            "examples_per_shard": options.examples_per_shard,
            "shard_multiple": options.shard_multiple,
        },
    }
    if options.record_kind == "path":
        recorded["path_root"] = path_root
    if options.record_kind == "example":  # the features a reader takes the label, key from
        recorded["label_feature"] = options.label_feature
        recorded["key_feature"] = options.key_feature
    return recorded


def dataset_info(
    settings: dict,
    shards: list[dict],
    plan: dict,
    vocab: dict,
    gate: dict,
    reject_summary: dict,
    near: dict | None = None,
) -> dict:
    """The content of dataset_info.json. Deterministic: no timestamps, sorted keys."""
    splits = {}
    for split, p in plan.items():
        listed = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in listed),
            "num_bytes": sum(s["num_bytes"] for s in listed),
            "num_shards": len(listed),
            # "": an example without --label_feature (no label)
            "label_counts": {k: n for k, n in p["label_counts"].items() if k},
            "shards": [{k: v for k, v in s.items() if k not in _NOT_LISTED} for s in listed],
        }
    found = {"near_duplicates": near} if near else {}
    return {
        **settings,
        **found,
        "labels": vocab["labels"],
        "formats": vocab["formats"],
        "splits": splits,
        "inputs": gate["inputs"],
        "rejects": {"total": gate["rejects"], "by_reason": reject_summary, "file": REJECTS_FILE},
    }


# what a shard's info holds for finalize only (FEATURE_STATS: the example kind's counts)
_NOT_LISTED = ("split", "index", FEATURE_STATS)


def _schema(info: dict, shards: list[dict], vocab: dict):
    """The dataset's schema: the record kind's, or for the example kind the one inferred
    from the records written (``schemas.inferred``)."""
    if info["record_kind"] != "example":
        return schemas.dataset_schema(info["record_kind"], vocab["labels"], vocab["formats"])
    stats = inferred.merge(s[FEATURE_STATS] for s in shards)
    return inferred.infer_schema(stats, sum(s["num_examples"] for s in shards))


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
            refuse(
                out,
                f"{gate['rejects']} of {gate['inputs']} inputs were rejected, above "
                f"--max_reject_fraction={gate['max_fraction']}; no dataset was written. "
                f"See {rejects_file} for each input and its reason, then fix the "
                "inputs or raise the limit",
            )
            return
        info = dataset_info(
            self._settings, shards, plan, vocab, gate, reject_summary, near[0] if near else None
        )
        written = sum(s["num_examples"] for s in info["splits"].values())
        if written + gate["rejects"] + len(changed) != gate["inputs"]:
            raise OperationError(  # a bug, never a user error: say so loudly
                f"counts do not reconcile: {gate['inputs']} inputs, {written} written, "
                f"{gate['rejects']} rejected, {len(changed)} changed"
            )
        if changed:  # the shards are one short each: no balanced dataset to declare
            add_rejects(rejects_file, changed)
            sources = ", ".join(sorted(r.source for r in changed)[:3])
            refuse(
                out,
                f"{len(changed)} input(s) changed while convert ran ({sources}"
                f"{', ...' if len(changed) > 3 else ''}); no dataset was written. They are "
                f"`changed` rejects in {rejects_file}; run again once the inputs "
                "stay as they are",
            )
            return
        for split, s in info["splits"].items():
            if s["num_examples"] != plan[split]["num_examples"]:
                raise OperationError(
                    f"split {split}: planned {plan[split]['num_examples']} "
                    f"examples, wrote {s['num_examples']}"
                )
        schema = _schema(info, shards, vocab)
        write_atomically(join(out, SCHEMA_FILE), schemas.to_text(schema).encode("utf-8"))
        labels_text = "".join(label + "\n" for label in vocab["labels"])
        write_atomically(join(out, LABELS_FILE), labels_text.encode("utf-8"))
        text = json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_atomically(join(out, INFO_FILE), text.encode("utf-8"))  # LAST
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

    ``settings``: what the info records of the flags (:func:`settings`); the other
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
