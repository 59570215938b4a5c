"""evenshard convert: image folder or manifest -> shuffled, split, balanced TFRecord shards.

``run`` only checks options and wires composite transforms; each concept
lives in its own module (sources, inspect_images, split, order, write,
finalize). Element shapes between the steps are in the comments.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time

from beam_jobs.options import ConvertOptions, UserError, parse_args

log = logging.getLogger(__name__)

# Files an earlier run of convert may have left in --output_dir (with the
# write step's temp folder, write.INCOMPLETE_DIR).
_OWN_PATTERNS = (
    "*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord*",
    "*.tmp-*",
    "schema.pbtxt",
    "labels.txt",
    "rejects/*",
)


def prepare_output(options: ConvertOptions) -> None:
    """Refuses a finished dataset without --overwrite; clears what earlier runs left.

    ``dataset_info.json`` goes first, so a directory is never a finished
    dataset with some of its files missing. Files that convert does not write
    are left alone.
    """
    from apache_beam.io.filesystems import FileSystems

    from beam_jobs import paths
    from beam_jobs.finalize import INFO_FILE
    from beam_jobs.sources import input_root
    from beam_jobs.write import INCOMPLETE_DIR

    out = options.output_dir.rstrip("/")
    if not options.is_manifest:
        root = input_root(options)
        if paths.normalize_root(out) == root or paths.relative_to(root, paths.normalize_root(out)):
            raise UserError(
                f"--output_dir {out} lies inside the input folder {root}; "
                "choose a folder outside it"
            )
    info = f"{out}/{INFO_FILE}"
    if FileSystems.exists(info):
        if not options.overwrite:
            raise UserError(
                f"--output_dir {out} holds a finished dataset; pass --overwrite "
                "to replace it, or choose another folder"
            )
        FileSystems.delete([info])
    leftovers = [
        m.path
        for r in FileSystems.match([f"{out}/{p}" for p in (*_OWN_PATTERNS, f"{INCOMPLETE_DIR}/*")])
        for m in r.metadata_list
    ]
    if leftovers:
        log.warning("evenshard: removing %d files of an earlier run from %s", len(leftovers), out)
        FileSystems.delete(leftovers)
    if not paths.is_url(out):
        os.makedirs(out, exist_ok=True)


def pipeline_options(pipeline_args: list[str]):
    """Beam's PipelineOptions of the flags convert does not own; unknown flags are errors.

    Beam only logs and drops flags it cannot parse, so a typo such as
    ``--seeed=3`` would silently run with the default seed.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    if any("dask" in a.lower() for a in pipeline_args if a.startswith("--runner")):
        try:  # registers DaskOptions (--dask_client_address, ...)
            import apache_beam.runners.dask.dask_runner  # noqa: F401
        except ImportError as e:
            raise UserError(
                f"--runner: the Dask runner needs `pip install evenshard[dask]` ({e})"
            ) from None
    # All DoFns live in installed modules, nothing in __main__, so the main
    # session need not be pickled (pickling it breaks under pytest).
    options = PipelineOptions(pipeline_args, save_main_session=False)
    known = options.get_all_options()
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        raise UserError(
            f"unknown flag(s): {', '.join('--' + u for u in unknown)}; "
            "see `evenshard convert --help` and Beam's pipeline options"
        )
    return options


def build(pipeline, options: ConvertOptions, vocabulary: list[str] | None, path_root: str | None):
    """Wires the conversion onto ``pipeline``; returns the PCollection of the dataset info."""
    import apache_beam as beam

    from beam_jobs.finalize import Finalize, RejectGate, WriteRejects
    from beam_jobs.inspect_images import InspectImages
    from beam_jobs.order import OrderAndShard, PlanShards
    from beam_jobs.sources import ReadInputs, input_root
    from beam_jobs.split import AssignSplits
    from beam_jobs.vocabulary import Vocabulary
    from beam_jobs.write import WriteShards

    o = options
    root = input_root(o)  # sources travel relative to it (paths.compact_source)
    inputs = pipeline | "ReadInputs" >> ReadInputs(o, vocabulary)
    # Candidate -> Image | Reject
    inspected = inputs["main"] | "InspectImages" >> InspectImages(
        o.verify, o.max_image_pixels, root
    )
    images = inspected["main"]
    rejects = (inputs["rejects"], inspected["rejects"]) | "AllRejects" >> beam.Flatten()
    reject_summary = rejects | "WriteRejects" >> WriteRejects(o.output_dir)
    gate = pipeline | "RejectGate" >> RejectGate(
        o.max_reject_fraction, inputs["inputs"], reject_summary
    )
    vocab = images | "Vocabulary" >> Vocabulary(vocabulary)
    # Image -> (split, Image)
    split_images = images | "AssignSplits" >> AssignSplits(o.splits, o.split_mode, o.split_seed)
    plan = split_images | "PlanShards" >> PlanShards(
        o.split_names, o.record_kind, o.target_shard_mb, o.shard_multiple, o.num_shards
    )
    # (split, Image) -> ((split, shard), (sort_key, Image))
    sharded = split_images | "OrderAndShard" >> OrderAndShard(o.seed, o.balance, plan)
    # -> shard info dicts
    shards = sharded | "WriteShards" >> WriteShards(
        o.output_dir, o.record_kind, o.shard_suffix, plan, vocab, gate, root
    )
    return pipeline | "Finalize" >> Finalize(
        o, path_root, shards, plan, vocab, gate, reject_summary
    )


def run(argv: list[str] | None = None, pipeline=None) -> dict | None:
    """Runs a conversion; returns the parsed dataset_info.json.

    Args:
        argv: command-line flags; those convert does not know go to Beam's
            PipelineOptions (--runner, --direct_num_workers, Dataflow flags).
            ``--runner=dask`` runs on a loopback Dask LocalCluster.
        pipeline: a pipeline to build on (tests pass a TestPipeline); it is
            run here.

    Returns:
        The dataset info, or None for a Dataflow ``--dry_run`` (translated,
        not submitted: nothing is written).

    Raises:
        UserError: a mistake in the flags or inputs, found before any work.
    """
    from beam_jobs.runners import resolve_runner

    options, pipeline_args = parse_args(argv)
    with resolve_runner(pipeline_args) as pipeline_args:
        beam_options = pipeline_options(pipeline_args)
        return _run(options, beam_options, pipeline)


def _run(options: ConvertOptions, beam_options, pipeline) -> dict | None:
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import TestOptions

    from beam_jobs import paths, sources
    from beam_jobs.finalize import INFO_FILE

    sources.check_input(options)
    vocabulary = sources.load_vocabulary(options.labels_file) if options.labels_file else None
    path_root = None
    if options.record_kind == "path":
        path_root = paths.normalize_root(options.path_root or sources.input_root(options))
    dry_run = beam_options.view_as(TestOptions).dry_run
    if not dry_run:
        prepare_output(options)

    if pipeline is None:
        import apache_beam as beam

        pipeline = beam.Pipeline(options=beam_options)
    build(pipeline, options, vocabulary, path_root)
    result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)  # the DaskRunner's; its cluster may stop next
        if client is not None:
            client.close()
    if dry_run:
        return None
    with FileSystems.open(f"{options.output_dir.rstrip('/')}/{INFO_FILE}") as f:
        return json.loads(f.read().decode("utf-8"))


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def summary(info: dict, output_dir: str, seconds: float) -> str:
    written = sum(s["num_examples"] for s in info["splits"].values())
    rejects = info["rejects"]
    lines = [
        f"evenshard convert: {info['inputs']} inputs -> {written} written, "
        f"{rejects['total']} rejected, in {seconds:.1f} s",
        f"  {'split':<12}{'examples':>10}{'shards':>8}{'bytes':>14}",
    ]
    for name, s in info["splits"].items():
        lines.append(
            f"  {name:<12}{s['num_examples']:>10}{s['num_shards']:>8}{_mb(s['num_bytes']):>14}"
        )
    if rejects["total"]:
        reasons = ", ".join(f"{r} {n}" for r, n in rejects["by_reason"].items())
        lines.append(f"  rejects: {reasons} (see {output_dir.rstrip('/')}/{rejects['file']})")
    lines.append(f"  labels: {len(info['labels'])}; output: {output_dir}")
    return "\n".join(lines)


_REJECT_LIMIT = re.compile(r"(\d+ of \d+ inputs were rejected.*?raise the limit)", re.S)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: one-line errors for user mistakes, a summary on success."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The runner logs a failing step's traceback at ERROR; ours are re-raised
    # (or shown as one line) below, so its copy is noise.
    logging.getLogger("apache_beam.runners").setLevel(logging.CRITICAL)
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        from beam_jobs.options import build_parser

        build_parser().print_help()
        return 0
    start = time.monotonic()
    try:
        info = run(argv)
    except UserError as e:
        print(f"evenshard convert: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the pipeline wraps our errors; show ours in one line
        found = _REJECT_LIMIT.search(str(e))
        if not found:
            raise
        print(f"evenshard convert: error: {found.group(1)}", file=sys.stderr)
        return 1
    if info is None:
        print("evenshard convert: dry run: the pipeline was translated, nothing was submitted")
        return 0
    output_dir = (
        next((a.split("=", 1)[1] for a in argv if a.startswith("--output_dir=")), None)
        or argv[argv.index("--output_dir") + 1]
    )
    print(summary(info, output_dir, time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
