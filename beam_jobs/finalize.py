"""WriteRejects, RejectGate and Finalize: the end of ``convert``.

Order of appearance in the output directory: shards and ``rejects/`` first,
then ``schema.pbtxt`` and ``labels.txt``, and ``dataset_info.json`` last. Its
presence means the dataset is complete; a run that fails or is killed leaves
none, and readers refuse such a directory.
"""

from __future__ import annotations

import json
import logging
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

import schemas
from beam_jobs import paths
from beam_jobs.options import ConvertOptions, Job
from beam_jobs.records import Reject
from schemas import storage, stores
from schemas.layout import (
    FORMAT_VERSION,
    INCOMPLETE_DIR,
    INFO_FILE,
    LABELS_FILE,
    REFUSED_FILE,
    REJECTS_FILE,
    SCHEMA_FILE,
    join,
    temp_name,
)


class DatasetRefused(RuntimeError):
    """The run ended without a dataset because of its inputs (more rejects than
    --max_reject_fraction allows, inputs rewritten while it ran): one line saying
    why and what to do.

    Never raised in a worker: finalize writes the line to ``REFUSED_FILE`` and
    the pipeline ends normally; ``convert`` raises this in the driver (a
    worker's exception reached the user wrapped, with a traceback a worker).
    """

    @classmethod
    def of_run(cls, output_dir: str) -> DatasetRefused | None:
        """The refusal the run into ``output_dir`` wrote, or None."""
        path = join(output_dir, REFUSED_FILE)
        if not FileSystems.exists(path):
            return None
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return cls(f.read().decode("utf-8"))


def write_atomically(path: str, data: bytes) -> None:
    """Writes to a unique temp name beside ``path`` and renames it into place; in a
    bucket (gs://, s3://), one put, which is atomic itself (and the empty file Beam's
    S3 filesystem cannot create: a multipart upload of no parts)."""
    if stores.store(path):
        storage.put(path, data)
        return
    tmp = temp_name(path, uuid.uuid4().hex)
    with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)
    FileSystems.rename([tmp], [path])


def write_rejects(path: str, rejects: list[Reject]) -> None:
    """The rejects file: a JSON line each, sorted. The whole reject sorts: one input can be
    rejected twice (a duplicate row of an empty file), and the runner decides which
    arrives first."""
    lines = [r.to_json() for r in sorted(rejects)]
    write_atomically(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def _add_rejects(path: str, rejects: list[Reject]) -> None:
    """Adds ``rejects`` to the rejects file written already (once: a retried finalize
    finds them there)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        written = [Reject(**json.loads(line)) for line in f.read().decode("utf-8").splitlines()]
    write_rejects(path, written + [r for r in rejects if r not in set(written)])


class WriteRejects(beam.PTransform):
    """Reject -> one summary {reason: count}; writes rejects/rejects.jsonl.

    All rejects go to one file in one worker, sorted by (key, source, reason,
    detail). Rejects are few by construction
    (the job fails above --max_reject_fraction, default 1%), so this is the
    metadata of about one shard at worst.
    """

    def __init__(self, output_dir: str):
        super().__init__()
        self._path = join(output_dir, REJECTS_FILE)

    def expand(self, rejects):
        path = self._path

        def write(all_rejects):
            write_rejects(path, all_rejects)
            summary: dict[str, int] = {}
            for r in all_rejects:
                summary[r.reason] = summary.get(r.reason, 0) + 1
            return dict(sorted(summary.items()))

        return rejects | "AllRejects" >> beam.combiners.ToList() | "WriteFile" >> beam.Map(write)


class RejectGate(beam.PTransform):
    """PBegin -> {"ok", "inputs", "rejects", "max_fraction"}: may shards be written?"""

    def __init__(self, max_fraction: float, inputs, reject_summary):
        super().__init__()
        self._max = max_fraction
        self._inputs, self._summary = inputs, reject_summary

    def expand(self, pbegin):
        max_fraction = self._max

        def gate(_, inputs, summary):
            rejected = sum(summary.values())
            ok = rejected <= max_fraction * inputs
            return {"ok": ok, "inputs": inputs, "rejects": rejected, "max_fraction": max_fraction}

        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Decide"
            >> beam.Map(
                gate,
                beam.pvalue.AsSingleton(self._inputs),
                beam.pvalue.AsSingleton(self._summary),
            )
        )


def dataset_info(
    options: ConvertOptions,
    shards: list[dict],
    plan: dict,
    vocab: dict,
    gate: dict,
    reject_summary: dict,
    path_root: str | None,
) -> dict:
    """The content of dataset_info.json. Deterministic: no timestamps, sorted keys."""
    splits = {}
    for split, p in plan.items():
        listed = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in listed),
            "num_bytes": sum(s["num_bytes"] for s in listed),
            "num_shards": len(listed),
            "label_counts": p["label_counts"],
            "shards": [{k: v for k, v in s.items() if k not in ("split", "index")} for s in listed],
        }
    info = {
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
            "shard_multiple": options.shard_multiple,
        },
        "labels": vocab["labels"],
        "formats": vocab["formats"],
        "splits": splits,
        "inputs": gate["inputs"],
        "rejects": {"total": gate["rejects"], "by_reason": reject_summary, "file": REJECTS_FILE},
    }
    if options.record_kind == "path":
        info["path_root"] = path_root
    return info


def refuse(out: str, message: str) -> None:
    """Ends the run without a dataset: ``message`` (one line) for the driver to raise."""
    logging.info("evenshard: no dataset: %s", message)
    write_atomically(join(out, REFUSED_FILE), message.encode("utf-8"))


class _Finalize(beam.DoFn):
    def __init__(self, job: Job):
        self._options = job.options
        self._path_root = job.path_root

    def process(self, _, shards, plan, vocab, gate, reject_summary, changed):
        o = self._options
        out = o.output_dir.rstrip("/")
        if not gate["ok"]:
            refuse(
                out,
                f"{gate['rejects']} of {gate['inputs']} inputs were rejected, above "
                f"--max_reject_fraction={o.max_reject_fraction}; no dataset was written. "
                f"See {out}/{REJECTS_FILE} for each input and its reason, then fix the "
                "inputs or raise the limit",
            )
            return
        info = dataset_info(o, shards, plan, vocab, gate, reject_summary, self._path_root)
        written = sum(s["num_examples"] for s in info["splits"].values())
        if written + gate["rejects"] + len(changed) != gate["inputs"]:
            raise RuntimeError(  # a bug, never a user error: say so loudly
                f"counts do not reconcile: {gate['inputs']} inputs, {written} written, "
                f"{gate['rejects']} rejected, {len(changed)} changed"
            )
        if changed:  # the shards are one short each: no balanced dataset to declare
            _add_rejects(join(out, REJECTS_FILE), changed)
            sources = ", ".join(sorted(r.source for r in changed)[:3])
            refuse(
                out,
                f"{len(changed)} input(s) changed while convert ran ({sources}"
                f"{', ...' if len(changed) > 3 else ''}); no dataset was written. They are "
                f"`changed` rejects in {out}/{REJECTS_FILE}; run again once the inputs "
                "stay as they are",
            )
            return
        for split, s in info["splits"].items():
            if s["num_examples"] != plan[split]["num_examples"]:
                raise RuntimeError(
                    f"split {split}: planned {plan[split]['num_examples']} "
                    f"examples, wrote {s['num_examples']}"
                )
        schema = schemas.dataset_schema(o.record_kind, vocab["labels"], vocab["formats"])
        write_atomically(join(out, SCHEMA_FILE), schemas.to_text(schema).encode("utf-8"))
        labels_text = "".join(label + "\n" for label in vocab["labels"])
        write_atomically(join(out, LABELS_FILE), labels_text.encode("utf-8"))
        text = json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_atomically(join(out, INFO_FILE), text.encode("utf-8"))  # LAST
        # after the info, which now lists the shards: until then the records in
        # .incomplete/ say which files in the folder this run wrote
        incomplete = paths.folder_files(join(out, INCOMPLETE_DIR))
        if incomplete:
            FileSystems.delete(incomplete)
        logging.info("evenshard: wrote %s examples to %s", written, out)
        yield info


class Finalize(beam.PTransform):
    """PBegin -> the dataset_info dict, once every shard and the rejects are written; or
    no dataset (``refuse``): too many rejects, or inputs that changed while shards were
    written (``changed``: added to the rejects file)."""

    def __init__(self, job: Job, shards, plan, vocab, gate, reject_summary, changed):
        super().__init__()
        self._fn = _Finalize(job)
        self._side = (shards, plan, vocab, gate, reject_summary, changed)

    def expand(self, pbegin):
        shards, plan, vocab, gate, summary, changed = self._side
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
            )
        )
