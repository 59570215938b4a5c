"""Datasets written as ``evenshard convert`` writes them, in one process, without Beam.

The reader tests need small finished datasets; converting each through a Beam
pipeline was most of the suite's time, and tested Beam again in files whose subject
is the reader. ``write_dataset`` takes convert's own flags for a local image folder
or CSV/JSONL manifest and runs convert's core (``convert_core``: each step a plain
function, which ``beam_jobs`` runs as Beam transforms over workers) in one process:
the same folder, byte for byte (``tests/test_dataset_writer.py`` pins it; Beam is
never imported: ``tests/test_convert_core.py``).

Not done (a ``ValueError`` names what to use instead): record inputs, ``--dedupe``,
URLs, Beam's own flags.
"""

from __future__ import annotations

import os

import schemas
from convert_core import paths
from convert_core.describe import (
    check_counts,
    check_planned,
    dataset_files,
    dataset_info,
    inputs_changed,
    settings,
    too_many_rejects,
)
from convert_core.files import LOCAL
from convert_core.inspection import Inspector
from convert_core.job import Job
from convert_core.listing import list_inputs, unique
from convert_core.options import parse_args
from convert_core.order import shards_of
from convert_core.plan_shards import plan_of, split_stats
from convert_core.preflight import preflight
from convert_core.records import Image, Reject
from convert_core.rejects import gate, rejects_text, summary
from convert_core.split import assign_splits
from convert_core.vocabulary import vocabulary
from convert_core.write import Sink, read_again, shard_files, shard_info, write_records
from schemas import layout, tfrecord

# Beam's flags the tests pass to convert: they choose how it runs, never what it writes.
_RUNNER_FLAGS = ("--direct_running_mode", "--direct_num_workers")
_MARKER = b"evenshard convert writes this folder\n"  # beam_jobs.output writes it first


def write_dataset(input_path: str, output_dir: str, *flags: str) -> dict:
    """Writes the dataset ``convert --input=INPUT --output_dir=OUT FLAGS`` writes.

    Args:
        input_path: a local image folder (label = first-level sub-folder) or a
            CSV/JSONL manifest.
        output_dir: a new or empty local folder.
        flags: convert's flags, as ``run_convert`` takes them (its default
            ``--max_reject_fraction=0.05`` applies here too).

    Returns:
        The dataset info, as ``convert.run`` returns it (without ``runner``).

    Raises:
        ValueError: an option this writer does not do, too many rejects, or inputs
            that changed while it ran.
    """
    flags = tuple(f for f in flags if not f.startswith(_RUNNER_FLAGS))
    if not any(f.startswith("--max_reject_fraction") for f in flags):
        flags += ("--max_reject_fraction=0.05",)
    options, beam_args = parse_args([f"--input={input_path}", f"--output_dir={output_dir}", *flags])
    _check_supported(options, beam_args)
    job = preflight(Job.of(options), LOCAL)
    o, out = job.options, job.output_dir
    listed = list_inputs(job.candidate_rules(), job.manifest, LOCAL)  # ReadInputs
    candidates = [c for c in listed if not isinstance(c, Reject)]
    rejects = [r for r in listed if isinstance(r, Reject)]
    if job.manifest is not None:
        candidates, duplicates = unique(job.input_root, candidates)
        rejects += duplicates
    inspector = Inspector(o.verify, o.max_image_pixels, job.input_root, int(o.max_image_mb * 10**6))
    inspector.setup()
    images = []
    for found in map(inspector.candidate, candidates):  # InspectImages
        (images if isinstance(found, Image) else rejects).append(found)
    by_reason = summary(rejects)  # WriteRejects, RejectGate
    allowed = gate(o.max_reject_fraction, len(listed), by_reason)
    if not allowed["ok"]:
        raise ValueError(too_many_rejects(allowed, job.rejects_file))
    vocab = vocabulary({im.label for im in images}, {im.format for im in images}, job.vocabulary)
    fractions = list(o.split_fractions)
    split_images = assign_splits(images, o.split_names, fractions, o.split_mode, o.split_seed)
    shard_rule = (o.target_shard_mb * 1e6, o.shard_multiple, o.num_shards, o.examples_per_shard)
    plan = plan_of(split_stats(split_images, o.record_kind), o.split_names, *shard_rule)
    os.makedirs(f"{out}/rejects", exist_ok=True)
    _put(out, layout.MARKER_FILE, _MARKER)
    label_ids = {label: i for i, label in enumerate(vocab["labels"])}
    shards, changed = [], []
    for split in sorted(plan):  # OrderAndShard, WriteShards
        members = [im for s, im in split_images if s == split]
        for index, shard in enumerate(shards_of(members, o.seed, o.balance, plan[split])):
            shards.append(_write_shard(job, split, index, shard, label_ids, plan, changed))
    _put(out, layout.REJECTS_FILE, rejects_text(rejects))
    info = dataset_info(settings(o, job.path_root), shards, plan, vocab, allowed, by_reason)
    check_counts(info, allowed, changed)  # Finalize
    if changed:
        raise ValueError(inputs_changed(changed, job.rejects_file))
    check_planned(info, plan)
    for name, data in dataset_files(info, shards, vocab):  # dataset_info.json last
        _put(out, name, data)
    return schemas.load_info(out)


def _check_supported(options, beam_args: list[str]) -> None:
    """What this writer does not do: each is Beam's or convert's to test."""
    unsupported = [
        (beam_args, f"Beam's flags {beam_args}"),
        (options.input_format != "images", f"--input_format={options.input_format}"),
        (options.dedupe != "none", f"--dedupe={options.dedupe}"),
        (paths.is_url(options.input) or paths.is_url(options.output_dir), "URLs"),
    ]
    for found, what in unsupported:
        if found:
            raise ValueError(f"write_dataset does not do {what}: use conftest.run_convert")


def _write_shard(job: Job, split: str, index: int, images, label_ids, plan, changed) -> dict:
    """One shard file and its DALI index; its entry in the info (an image that changed
    since inspection: into ``changed``)."""
    o = job.options
    files = shard_files(split, index, plan[split]["num_shards"], o.compression, False)
    name, index_file, _ = files
    with open(layout.join(job.output_dir, name), "wb") as f:
        sink = Sink(f, gzip=o.compression == "gzip")
        written = write_records(
            sink,
            images,
            lambda source, im: read_again(LOCAL, source, im),
            job.input_root,
            label_ids,
            o.record_kind,
            fingerprints=False,
        )
    changed += written.changed
    if index_file:
        _put(job.output_dir, index_file, tfrecord.index_text(written.lengths))
    return shard_info(split, index, files, sink, written, o.record_kind)


def _put(out: str, name: str, data: bytes) -> None:
    with open(layout.join(out, name), "wb") as f:
        f.write(data)
