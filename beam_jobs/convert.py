"""convert: image folder or manifest -> shuffled, split, balanced TFRecord shards.

The driver, one way: the flags (convert's own, then Beam's, an unknown one an
error), the runner, the frozen ``Job`` (every path resolved once, the inputs
checked: ``convert_core.preflight``), the output folder (``convert_core.output``),
the pipeline (``beam_jobs.steps.build`` wires its composite transforms) run,
and the dataset info it wrote.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import shutil

from convert_core.job import Job
from convert_core.options import ConvertOptions, UserError, parse_args
from schemas import layout, storage

log = logging.getLogger(__name__)


def pipeline_options(pipeline_args: list[str]):
    """Beam's PipelineOptions of the flags convert does not own; unknown flags are errors.

    Beam only logs and drops flags it cannot parse, so a typo such as
    ``--seeed=3`` would silently run with the default seed.
    """
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import create_runner

    from beam_jobs.beam_options import BeamOptions

    if any("dask" in a.lower() for a in pipeline_args if a.startswith("--runner")):
        try:  # registers DaskOptions (--dask_client_address, ...)
            import apache_beam.runners.dask.dask_runner  # noqa: F401
        except ImportError as e:
            raise UserError(
                f"--runner: the Dask runner needs `pip install evenshard[dask]` ({e})"
            ) from None
    aws = sorted({a.split("=", 1)[0] for a in pipeline_args if a.startswith("--s3_")})
    if aws:  # Beam's S3 file system's flags: convert reaches s3:// through boto3 alone
        raise UserError(
            f"{', '.join(aws)}: convert reaches s3:// through boto3, which takes its endpoint, "
            "region and credentials from its own settings: set AWS_ENDPOINT_URL, "
            "AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or `aws "
            "configure`) instead"
        )
    # All DoFns live in installed modules, nothing in __main__, so the main
    # session need not be pickled (pickling it breaks under pytest).
    options = BeamOptions(pipeline_args, save_main_session=False)
    runner = options.view_as(StandardOptions).runner
    if runner:
        try:
            create_runner(runner)
        except (ValueError, ImportError) as e:
            raise UserError(f"--runner={runner}: {e}") from None
    known, every = _parsed_options(options)
    unknown = sorted(set(every) - set(known))
    if unknown:
        names = _flag_names(known)
        typed = {a[2:].split("=", 1)[0] for a in pipeline_args if a.startswith("--")}
        hints = []
        for u in unknown:
            given = next((t for t in sorted(typed) if t.replace("-", "_") == u), u)
            close = difflib.get_close_matches(u, names, n=1, cutoff=0.75)
            hints.append(f"--{given}" + (f" (did you mean --{close[0]}?)" if close else ""))
        raise UserError(
            f"unknown flag(s): {', '.join(hints)}; "
            "see `evenshard convert --help` and Beam's pipeline options"
        )
    return options


def _parsed_options(options) -> tuple[dict, dict]:
    """(options Beam knows, every option given), without Beam's log line for the unknown
    ones and without argparse's usage dump for a bad value (one line instead)."""
    import io

    quiet = logging.getLogger("apache_beam.options.pipeline_options")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            return options.get_all_options(), options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        error = usage.getvalue().strip().splitlines()[-1:] or ["a Beam flag is invalid"]
        raise UserError(error[0].split("error: ", 1)[-1]) from None
    finally:
        quiet.setLevel(level)


def _flag_names(beam_known: dict) -> list[str]:
    """Every flag name convert takes: its own and Beam's."""
    from convert_core.options import build_parser

    own = [a.dest for a in build_parser()._actions if a.dest != "help"]
    return sorted({*own, *beam_known})


def run(argv: list[str] | None = None, pipeline=None) -> dict:
    """Runs a conversion from command-line flags; returns the parsed dataset_info.json.

    Args:
        argv: command-line flags; those convert does not know go to Beam's
            PipelineOptions (--runner, --direct_num_workers, Dataflow flags).
            ``--runner=dask`` runs on a loopback Dask LocalCluster.
        pipeline: a pipeline to build on (tests pass a TestPipeline); it is
            run here.

    From the first call on, Beam in this process inspects each DoFn instance once
    (``compat_beam.remember_dofn_specs``: the same answers, a sixth less CPU a small
    convert), a caller's own later pipelines too.

    Returns:
        The dataset info (plus ``runner``: the runner and its workers in
        words, which the file does not hold); for a ``--dry_run`` (translated,
        not submitted: nothing is written) ``{"dry_run": True, "steps": [...]}``,
        the pipeline's top-level steps in order.

    Raises:
        UserError: a mistake in the flags or inputs, found before any work.
        DatasetRefused: the run ended without a dataset because of its inputs
            (too many rejects, inputs that changed while it ran), in one line.
    """
    options, pipeline_args = parse_args(argv)
    return convert(options, pipeline_args, pipeline)


def convert(options: ConvertOptions, pipeline_args: list[str], pipeline=None) -> dict:
    """Runs a conversion of parsed options; see :func:`run`.

    In the driver, in order: the runner and Beam's flags, the Job (its paths
    resolved by ``Job.of``, its inputs checked by ``preflight``), the output
    folder claimed (``output.claim``), the pipeline built (``steps.build``) and
    run, and the dataset info it wrote.
    """
    from beam_jobs import runners
    from beam_jobs.forked_workers import fork_server
    from beam_jobs.input_size import has_at_least
    from beam_jobs.runners import (
        MULTI_PROCESSING_FROM,
        lean_malloc,
        local_default,
        resolve_runner,
    )

    lean_malloc()
    resolved = Job.of(options)  # every path, once; nothing is read yet
    many = functools.partial(has_at_least, resolved, MULTI_PROCESSING_FROM)
    with contextlib.ExitStack() as running:
        pipeline_args = running.enter_context(resolve_runner(local_default(pipeline_args, many)))
        # the fork server starts before Beam is imported here: it imports as we do
        running.enter_context(fork_server(pipeline_args))
        from apache_beam.options.pipeline_options import TestOptions

        from beam_jobs import compat_beam
        from beam_jobs.record_preflight import RECORDS
        from beam_jobs.steps import build
        from convert_core import output
        from convert_core.preflight import preflight
        from schemas.info import parse_info

        compat_beam.remember_dofn_specs()  # Beam inspects each DoFn once, not 4 times
        beam_options = pipeline_options(pipeline_args)
        dry_run = bool(beam_options.view_as(TestOptions).dry_run)
        if dry_run:
            _check_dry_run(beam_options)
        job = preflight(resolved, RECORDS, offline=dry_run)
        own = pipeline is None
        if own:
            pipeline = _pipeline(beam_options)
            # Beam removes its temp folder as a run ends; one never run keeps it
            running.callback(shutil.rmtree, pipeline.local_tempdir, ignore_errors=True)
        # a refusal the run wrote is raised as it ends; a dry run writes nothing
        with contextlib.nullcontext() if dry_run else output.claim(job):
            build(pipeline, job)
            result = _run(pipeline)
        if dry_run:
            _write_job_file(result, beam_options)
            return {
                "dry_run": True,
                "steps": [t.full_label for t in pipeline.transforms_stack[0].parts],
            }
        path = layout.join(job.output_dir, layout.INFO_FILE)
        info = parse_info(storage.read_bytes(path), path)
        info["runner"] = runners.describe(beam_options)  # while a Dask cluster still runs
        return info


def _check_dry_run(beam_options) -> None:
    """``--dry_run`` is Dataflow's: its runner translates the job and stops. Every other
    runner ignores it and runs the job, writing the dataset the user asked not to."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = beam_options.view_as(StandardOptions).runner or "DirectRunner"
    if not runner.rsplit(".", 1)[-1].lower().startswith("dataflow"):
        raise UserError(
            f"--dry_run only applies to --runner=DataflowRunner (it translates the job "
            f"without submitting it); with --runner={runner} the job would run and write "
            "its output: drop --dry_run, or add --runner=DataflowRunner and its flags"
        )


def _pipeline(beam_options):
    """A Beam pipeline of ``beam_options``; Beam's own checks of them as UserErrors."""
    import apache_beam as beam

    try:
        return beam.Pipeline(options=beam_options)
    except ValueError as e:  # Beam's option validation (Dataflow's project ID, ...)
        raise UserError(" ".join(str(e).split())) from None


def _run(pipeline):
    """Runs ``pipeline`` to its end; returns its result."""
    result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)  # the DaskRunner's; its cluster may stop
        if client is not None:
            client.close()
    return result


def _write_job_file(result, beam_options) -> None:
    """Dry run with ``--dataflow_job_file``: Dataflow's runner stops before writing it.

    Written here: the job request as far as it is built offline (name,
    project, type) and the translated pipeline (Beam's runner-API proto, the
    steps Dataflow would run), as JSON. The staging of the full job
    description needs the cloud.
    """
    import json

    from apache_beam.options.pipeline_options import DebugOptions
    from google.protobuf import json_format

    path = beam_options.view_as(DebugOptions).dataflow_job_file
    job = getattr(result, "job", None)
    if path and job is not None:
        text = json.dumps(
            {
                "job": json.loads(job.json()),
                "pipeline": json_format.MessageToDict(job.proto_pipeline),
            },
            indent=2,
        )
        storage.write_atomically(path, text.encode("utf-8"))
