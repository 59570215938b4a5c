"""The same bytes on other runners: Dask on a loopback LocalCluster; Dataflow translation."""

from __future__ import annotations

import logging
import os
import re
import tarfile

import pytest
from conftest import run_convert, write_manifest

from convert_core.options import UserError
from evenshard import cli


def shas(info):
    return [s["sha256"] for name in sorted(info["splits"]) for s in info["splits"][name]["shards"]]


def valid_as_the_direct_output(out: str, info: dict, direct_out: str, direct: dict) -> None:
    """What ``validate --full`` of a Dask output (``run_convert(validated=False)``) checks,
    when it is the DirectRunner's, whose full validation passed: its folder (validate
    without --full: the files, their sizes and sha256s), every file but the info the
    DirectRunner's bytes (shards, DALI indexes, schema, labels, rejects), and the info's
    splits (records and labels a shard) the same: each record checked against them
    again would be the same check on the same bytes."""
    from audit.validate import validate
    from schemas import layout

    def files(folder):
        return sorted(
            os.path.relpath(os.path.join(d, f), folder)
            for d, _, names in os.walk(folder)
            for f in names
            if f != layout.INFO_FILE
        )

    assert validate(out) == []
    assert info["splits"] == direct["splits"]
    assert files(out) == files(direct_out)
    for name in files(direct_out):
        with (
            open(os.path.join(out, name), "rb") as a,
            open(os.path.join(direct_out, name), "rb") as b,
        ):
            assert a.read() == b.read(), name


@pytest.fixture(scope="module")
def direct_out(folder_500, tmp_path_factory):
    """The DirectRunner's output folder and info (validated --full)."""
    out = str(tmp_path_factory.mktemp("direct"))
    return out, run_convert(folder_500[0], out, "--num_shards=3", "--seed=11", "--balance=label")


@pytest.mark.slow
def test_dask_cluster_gives_the_direct_runner_bytes(
    folder_500, direct_out, dask_runner_flags, tmp_path
):
    """On a cluster given by its address (the session's), as Beam's DaskRunner too."""
    _, address = dask_runner_flags
    info = run_convert(
        folder_500[0],
        str(tmp_path / "dask"),
        "--num_shards=3",
        "--seed=11",
        "--balance=label",
        f"--runner={convert_runner()}",
        address,
        validated=False,
    )
    out, direct = direct_out
    assert shas(info) == shas(direct)
    assert info["inputs"] == direct["inputs"]
    valid_as_the_direct_output(str(tmp_path / "dask"), info, out, direct)


def test_an_unreachable_dask_scheduler_is_one_line_at_once(folder_500, tmp_path):
    with pytest.raises(UserError, match="no Dask scheduler answers there"):
        run_convert(
            folder_500[0],
            str(tmp_path / "out"),
            "--runner=dask",
            "--dask_client_address=tcp://127.0.0.1:1",
        )


@pytest.mark.slow
def test_dask_manifest_with_rejects_gives_the_direct_runner_bytes(folder_500, tmp_path, caplog):
    """The default options (global rank, hash split) from a manifest with duplicates and
    missing files: every step that several steps read (the plan, the rank table, the
    dedupe) runs once on Dask, and the shards and rejects equal the DirectRunner's.

    On the alias (``--runner=dask --dask_workers=2``), which starts and stops a loopback
    cluster of its own, named in the info, and keeps distributed's INFO chatter out of
    the log (these checks had a test of their own, a third Dask run of folder_500)."""
    root = folder_500[0]
    rows = [
        {"path": os.path.join(root, label, name), "label": label}
        for label in sorted(os.listdir(root))
        if os.path.isdir(os.path.join(root, label))
        for name in sorted(os.listdir(os.path.join(root, label)))
    ]
    rows += [dict(rows[0]), {"path": "gone/never.jpg", "label": "gone"}]  # duplicate, missing
    manifest = write_manifest(str(tmp_path / "m.csv"), rows, ["path", "label"])
    flags = ["--target_shard_mb=0.05", "--max_reject_fraction=0.2"]
    direct = run_convert(manifest, str(tmp_path / "direct"), *flags)
    caplog.set_level(logging.INFO)
    dask = run_convert(
        manifest,
        str(tmp_path / "dask"),
        *flags,
        "--runner=dask",
        "--dask_workers=2",
        validated=False,
    )
    valid_as_the_direct_output(str(tmp_path / "dask"), dask, str(tmp_path / "direct"), direct)
    assert re.fullmatch(r"DaskRunner \(tcp://127\.0\.0\.1:\d+, 2 workers\)", dask["runner"])
    chatter = [r for r in caplog.records if r.name.startswith("distributed")]
    assert all(r.levelno >= logging.WARNING for r in chatter), [r.getMessage() for r in chatter]
    assert sum(s["num_shards"] for s in direct["splits"].values()) > 3
    assert shas(dask) == shas(direct)
    assert dask["rejects"] == direct["rejects"]
    assert dask["rejects"]["by_reason"]["duplicate_key"] == 1
    with open(tmp_path / "direct" / "rejects" / "rejects.jsonl", "rb") as a:
        with open(tmp_path / "dask" / "rejects" / "rejects.jsonl", "rb") as b:
            assert a.read() == b.read()


def convert_runner() -> str:
    from beam_jobs.runners import DASK_RUNNER

    return DASK_RUNNER


def test_dataflow_translation_without_submitting(folder_500, tmp_path, capsys):
    """Beam's own dry run (as in dataflow_runner_test.py): no credentials, no network."""
    out = tmp_path / "never_written"
    argv = [
        f"--input={folder_500[0]}",
        f"--output_dir={out}",
        "--runner=DataflowRunner",
        "--project=test-project",
        "--region=us-central1",
        "--job_name=evenshard-test",
        "--temp_location=gs://bucket/tmp",
        "--staging_location=gs://bucket/staging",
        "--no_auth",
        "--dry_run=True",
        "--sdk_location=container",
        "--setup_file=./setup.py",
    ]
    assert cli.main(["convert", *argv]) == 0
    assert "dry run" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize("runner", [[], ["--runner=dask"]])
def test_a_dry_run_off_dataflow_is_refused_before_anything_is_written(folder_500, tmp_path, runner):
    """Only Dataflow's runner honours --dry_run; the local runner used to run the job and
    write the whole dataset while the summary said nothing was submitted."""
    out = tmp_path / "never_written"
    argv = [f"--input={folder_500[0]}", f"--output_dir={out}", "--dry_run=True", *runner]
    with pytest.raises(UserError, match="--dry_run only applies to --runner=DataflowRunner"):
        run_convert(folder_500[0], str(out), *argv[2:])
    assert not out.exists()


def test_the_package_ships_with_setup_file(tmp_path):
    """What Dataflow's stager does with --setup_file: build an sdist of this project."""
    from apache_beam.runners.portability.stager import Stager

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tarball = Stager._build_setup_package(os.path.join(root, "setup.py"), str(tmp_path), None)
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    for needed in (
        "beam_jobs/convert.py",
        "convert_core/inspection.py",  # the steps' core, which every worker runs
        "reader/pipeline.py",
        "schemas/layout.py",
        "evenshard/cli.py",
        "schemas/image.pbtxt",
        "schemas/path.pbtxt",
        "setup.py",
    ):
        assert any(n.endswith(needed) for n in names), needed


def test_the_readmes_dataflow_command_dry_runs_offline(tmp_path, capsys, caplog):
    """The README's command as written, gs:// in and out, plus --dry_run=True: no network."""
    import re
    import shlex

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    (command,) = re.findall(r"\n(evenshard convert --input gs://[^`]*?)\n```", readme)
    argv = shlex.split(command.replace("\\\n", " "))[2:]
    job = tmp_path / "job.json"
    cwd = os.getcwd()
    os.chdir(root)  # the README runs it from the project's root (--setup_file ./setup.py)
    try:
        code = cli.main(["convert", *argv, "--dry_run=True", f"--dataflow_job_file={job}"])
    finally:
        os.chdir(cwd)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    steps = captured.out.splitlines()[-1]
    assert steps.startswith("  steps: ReadInputs -> InspectImages") and "Finalize" in steps
    assert "cloud checks skipped: --input exists" in caplog.text
    assert "WriteShards" in job.read_text()


@pytest.mark.parametrize(
    "given",
    [
        [],
        ["--runner=DirectRunner"],
        ["--runner=direct"],
        ["--runner=SwitchingDirectRunner"],
        ["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"],
    ],
)
def test_the_local_runner_never_goes_to_prism(given, tmp_path, caplog):
    """Beam's DirectRunner would download Prism's binary from GitHub and run the job there;
    convert's local runs are the FnApiRunner's, the engine its bytes are pinned on."""
    from beam_jobs.runners import LOCAL_RUNNER, resolve_runner
    from evenshard import synthetic

    with resolve_runner([*given, "--direct_num_workers=1"]) as args:
        assert args == [f"--runner={LOCAL_RUNNER}", "--direct_num_workers=1"]
    with resolve_runner(["--runner=PrismRunner"]) as args:
        assert args == ["--runner=PrismRunner"]  # asked for by name: the user's
    if given:
        return
    root = str(tmp_path / "images")
    synthetic.make_image_folder(root, num_labels=2, per_label=3, formats=("jpeg",))
    caplog.set_level(logging.INFO)
    info = run_convert(root, str(tmp_path / "out"))
    assert info["runner"] == "DirectRunner (in_memory, 1 worker)"
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "prism" in m.lower()], said


def test_the_local_runners_worker_processes_get_the_jobs_options():
    """Worker processes of the local runner start with the job's options, as Beam's
    DirectRunner gives them (a bare FnApiRunner gave them none): their file systems
    see the run's flags."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_jobs.runners import resolve_runner

    def endpoint_seen_by_the_worker(_):  # nested: pickled by value, for the worker
        from apache_beam.io.filesystems import FileSystems

        options = FileSystems._pipeline_options
        return None if options is None else options.get_all_options().get("s3_endpoint_url")

    flags = ["--direct_running_mode=multi_processing", "--direct_num_workers=1"]
    flags.append("--s3_endpoint_url=http://127.0.0.1:9")
    with resolve_runner(flags) as args, beam.Pipeline(options=PipelineOptions(args)) as p:
        seen = p | beam.Create([0]) | beam.Map(endpoint_seen_by_the_worker)
        assert_that(seen, equal_to(["http://127.0.0.1:9"]))


def test_convert_options_make_each_view_once_and_share_its_values():
    """convert's Beam options hand back one view a class (Beam builds and parses a new
    parser on every ``view_as``); a value set through any view is every view's, and a
    copy or a pickle of the options is whole and makes views of its own."""
    import copy
    import pickle

    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    from beam_jobs.convert import pipeline_options

    options = pipeline_options(["--runner=beam_jobs.local_runner.LocalRunner"])
    standard = options.view_as(StandardOptions)
    assert options.view_as(StandardOptions) is standard
    options.view_as(DirectOptions).direct_num_workers = 3
    standard.streaming = True
    assert options.view_as(DirectOptions).direct_num_workers == 3
    assert options.get_all_options()["streaming"] is True
    for other in (copy.deepcopy(options), pickle.loads(pickle.dumps(options))):
        assert other.view_as(StandardOptions) is not standard
        assert other.view_as(DirectOptions).direct_num_workers == 3
        assert other.view_as(StandardOptions).runner == "beam_jobs.local_runner.LocalRunner"
        other.view_as(DirectOptions).direct_num_workers = 5  # its own values
    assert options.view_as(DirectOptions).direct_num_workers == 3


@pytest.mark.parametrize(
    "flags, pandas",
    [
        ([], "refused"),
        (["--runner=DirectRunner"], "refused"),
        (["--runner", "dask"], "-"),
        (["--runner=DataflowRunner"], "-"),
    ],
)
def test_the_command_refuses_beams_unused_imports_for_a_local_convert_only(flags, pandas):
    """The ``evenshard`` command (its own process) refuses pandas and pyarrow, which
    Beam imports only if it can, when the convert runs locally; for another runner, or
    called as a function in a user's process (``cli.main``), nothing is refused."""
    import subprocess
    import sys

    from beam_jobs import runners

    check = (
        "import os, sys; from evenshard import cli; "
        f"sys.argv = ['evenshard', 'convert', '--help', *{flags!r}]; "
        "os._exit = lambda code: print({None: 'refused'}.get(sys.modules.get('pandas', '-'), "
        "'imported' if 'pandas' in sys.modules else '-')); cli.run()"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == pandas
    assert cli.main(["convert", "--help"]) == 0
    assert sys.modules.get("pandas", "-") is not None  # this process: nothing refused
    assert runners.runs_locally(["--runner=apache_beam.runners.direct.direct_runner.DirectRunner"])
