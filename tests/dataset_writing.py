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

import schemas
from convert_core import paths
from convert_core.inspection import Inspector
from convert_core.job import Job
from convert_core.listing import list_inputs, unique
from convert_core.options import parse_args
from convert_core.order import shards_of
from convert_core.output import claim, finish, write_rejects
from convert_core.plan_shards import plan_of, split_stats
from convert_core.preflight import preflight
from convert_core.records import Image, Reject
from convert_core.rejects import gate, summary
from convert_core.split import assign_splits
from convert_core.vocabulary import vocabulary
from convert_core.write import Shards, read_again, write_shard

# Beam's flags the tests pass to convert: they choose how it runs, never what it writes.
_RUNNER_FLAGS = ("--direct_running_mode", "--direct_num_workers")


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
        ValueError: an option this writer does not do.
        convert_core.options.DatasetRefused: too many rejects, or inputs that changed
            while it ran (as convert).
    """
    flags = tuple(f for f in flags if not f.startswith(_RUNNER_FLAGS))
    if not any(f.startswith("--max_reject_fraction") for f in flags):
        flags += ("--max_reject_fraction=0.05",)
    options, beam_args = parse_args([f"--input={input_path}", f"--output_dir={output_dir}", *flags])
    _check_supported(options, beam_args)
    job = preflight(Job.of(options))
    o, out = job.options, job.output_dir
    listed = list_inputs(job.rules, job.manifest)  # ReadInputs
    candidates = [c for c in listed if not isinstance(c, Reject)]
    rejects = [r for r in listed if isinstance(r, Reject)]
    if job.manifest is not None:
        candidates, duplicates = unique(job.input_root, candidates)
        rejects += duplicates
    inspector = Inspector.of(job)
    inspector.setup()
    images = []
    for found in map(inspector.candidate, candidates):  # InspectImages
        (images if isinstance(found, Image) else rejects).append(found)
    by_reason = summary(rejects)  # WriteRejects, RejectGate
    allowed = gate(o.max_reject_fraction, len(listed), by_reason)
    vocab = vocabulary({im.label for im in images}, {im.format for im in images}, job.vocabulary)
    fractions = list(o.split_fractions)
    split_images = assign_splits(images, o.split_names, fractions, o.split_mode, o.split_seed)
    shard_rule = (o.target_shard_mb * 1e6, o.shard_multiple, o.num_shards, o.examples_per_shard)
    plan = plan_of(split_stats(split_images, o.record_kind), o.split_names, *shard_rule)
    label_ids = {label: i for i, label in enumerate(vocab["labels"])}
    writing = Shards.of(job)  # how the shards are written
    with claim(job):  # locks and prepares the folder; raises a refusal as it ends
        write_rejects(job.rejects_file, rejects)
        shards, changed = [], []
        for split in sorted(plan) if allowed["ok"] else []:  # OrderAndShard, WriteShards
            members = [im for s, im in split_images if s == split]
            for index, shard in enumerate(shards_of(members, o.seed, o.balance, plan[split])):
                num_shards = plan[split]["num_shards"]
                entry, written = write_shard(
                    writing, split, index, num_shards, shard, read_again, label_ids
                )
                shards.append(entry)
                changed += written.changed
        finish(  # Finalize
            out,
            job.incomplete_dir,
            job.rejects_file,
            job.settings,
            shards,
            plan,
            vocab,
            allowed,
            by_reason,
            changed,
        )
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
