"""The local runner's worker processes, forked ready by a fork server (beam_jobs/forked_workers.py):
the job's workers are its forks, a missing server falls back to Beam's own workers, a
worker's exit code reaches Beam, and the server ends with the block."""

from __future__ import annotations

import os
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import forked_workers
from beam_jobs.runners import LOCAL_RUNNER

ARGS = [
    f"--runner={LOCAL_RUNNER}",
    "--direct_running_mode=multi_processing",
    "--direct_num_workers=2",
]


def _run(folder: str) -> tuple[list[int], set[int], set[str]]:
    """A small pipeline on the local runner's worker processes; (its output, the parents
    of the processes that ran it, whether pandas was imported or refused in each)."""
    out = os.path.join(folder, "out")
    seen = os.path.join(folder, "seen")
    os.makedirs(seen)

    def doubled(x):  # nested: pickled by value (the workers cannot import this module)
        import os
        import sys

        pandas = {None: "refused"}.get(sys.modules.get("pandas", "-"), "imported")
        open(os.path.join(seen, f"{os.getpid()}-{os.getppid()}-{pandas}"), "w").close()
        return x * 2

    with beam.Pipeline(options=PipelineOptions(ARGS)) as p:
        (
            p
            | beam.Create(range(20))
            | beam.Reshuffle()
            | beam.Map(doubled)
            | beam.Map(str)
            | beam.io.WriteToText(out, shard_name_template="")
        )
    with open(out) as f:
        values = sorted(int(line) for line in f)
    names = [name.split("-") for name in os.listdir(seen)]
    return values, {int(n[1]) for n in names}, {n[2] for n in names}


@pytest.mark.slow
def test_the_workers_are_forks_of_the_server(tmp_path):
    with forked_workers.fork_server(ARGS) as server:
        assert server is not None
        values, parents, pandas = _run(str(tmp_path))
    assert values == [2 * x for x in range(20)]
    assert parents == {server.pid}
    assert pandas == {"refused"}  # Beam's optional imports no step uses (runners.lean_imports)
    assert server.poll() is not None  # the server ended with the block
    assert forked_workers.ENV not in os.environ


@pytest.mark.slow
def test_without_a_server_the_client_starts_beams_own_worker(tmp_path, monkeypatch):
    monkeypatch.setenv(forked_workers.ENV, str(tmp_path / "no-server"))
    values, parents, pandas = _run(str(tmp_path))
    assert values == [2 * x for x in range(20)]
    assert pandas == {"imported"}
    # each worker is the process Beam started (its shell and the client exec'd into
    # Beam's worker), a child of this one, not a fork of a server
    assert parents == {os.getpid()}


@pytest.mark.fast
def test_a_client_whose_server_ended_starts_no_worker(tmp_path):
    """The server gone with its folder (the run is ending, or Ctrl-C stopped it): a
    client that starts late exits 1 at once, silently, instead of becoming Beam's own
    worker (which would find its runner gone and print tracebacks)."""
    gone = str(tmp_path / "evenshard-workers-gone" / "socket")
    done = subprocess.run(
        forked_workers.command(gone), shell=True, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")


def test_a_workers_exit_code_reaches_beam(tmp_path):
    """A worker that cannot start (no control address here) exits 1, and so does the
    command Beam waits on: the job fails rather than waiting."""
    with forked_workers.fork_server(ARGS) as server:
        env = {k: v for k, v in os.environ.items() if "API_SERVICE" not in k}
        done = subprocess.run(
            forked_workers.command(os.environ[forked_workers.ENV]),
            shell=True,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert "CONTROL_API_SERVICE_DESCRIPTOR" in done.stderr  # the worker's own traceback
    assert server.poll() is not None


def test_a_long_tmpdir_still_gets_a_server(tmp_path, monkeypatch):
    """A Unix socket's path has at most 107 bytes: under a longer TMPDIR (pytest-xdist's
    own run deep enough) the socket goes under /tmp instead, and the workers are forked."""
    import tempfile

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with forked_workers.fork_server(ARGS) as server:
        assert server is not None
        assert os.environ[forked_workers.ENV].startswith("/tmp/evenshard-workers-")
        assert server.poll() is None
    assert not os.listdir(deep)


def test_a_server_whose_driver_is_gone_stops_and_clears_its_folder():
    """The driver killed (its stdin to the server closed, no cleanup of its own): the
    server ends and removes its socket's folder."""
    with forked_workers.fork_server(ARGS) as server:
        folder = os.path.dirname(os.environ[forked_workers.ENV])
        server.stdin.close()
        server.wait(timeout=60)
        assert not os.path.exists(folder)


@pytest.mark.fast
def test_only_local_worker_processes_want_a_server(monkeypatch):
    assert forked_workers.wanted(ARGS) == sys.platform.startswith("linux")
    assert not forked_workers.wanted([f"--runner={LOCAL_RUNNER}"])
    assert not forked_workers.wanted(["--runner=DataflowRunner", *ARGS[1:]])
    spaced = [f"--runner={LOCAL_RUNNER}", "--direct_running_mode", "multi_processing"]
    assert forked_workers.wanted(spaced) == sys.platform.startswith("linux")
    monkeypatch.setenv(forked_workers.ENV, "")  # turned off: Beam's own workers
    with forked_workers.fork_server(ARGS) as server:
        assert server is None


_KILLED = """
import os, signal
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from beam_jobs.forked_workers import fork_server

def die(_):
    os.kill(os.getpid(), signal.SIGKILL)

args = {args!r}
with fork_server(args):
    with beam.Pipeline(options=PipelineOptions(args)) as p:
        p | beam.Impulse() | beam.Map(die)  # a bundle that reads no data from the runner
"""


@pytest.mark.slow
def test_a_worker_killed_mid_bundle_fails_the_job_instead_of_hanging(tmp_path):
    """Beam's handler only logged a worker process's early end: a bundle that reads no
    data from the runner then waited for the dead worker's answer forever."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED.format(args=ARGS))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "WorkerLost: worker process " in done.stderr
    assert "was killed by SIGKILL (signal 9)" in done.stderr


def _ours(tmpdir: str) -> list[int]:
    """The processes (Linux) whose environment names this TMPDIR: a run's and its
    children's, whatever their process group."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"TMPDIR={tmpdir}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_ctrl_c_ends_a_local_convert_in_one_line_and_the_next_run_finishes(folder_500, tmp_path):
    """Ctrl-C (SIGINT to the command's whole process group, as a terminal sends it)
    while the workers run: one line, exit code 130, no traceback; no process left
    (the fork server's group included), the output folder's lock released, no temp
    folder left; the same command then finishes (some 300 lines of Beam's tracebacks
    before, and then the lock was left)."""
    import signal
    import time

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    exe = os.path.join(os.path.dirname(sys.executable), "evenshard")
    out = tmp_path / "out"
    argv = [exe, "convert", f"--input={folder_500[0]}", f"--output_dir={out}"]
    argv += ["--max_reject_fraction=0.05", *ARGS[1:]]
    env = dict(os.environ, EVENSHARD_PROGRESS_SECONDS="0", TMPDIR=str(tmpdir))
    run = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    said = []
    for line in run.stderr:  # a worker's first progress line: the job is running
        said.append(line)
        if line.startswith("evenshard: list:"):
            os.killpg(run.pid, signal.SIGINT)
            break
    said += run.stderr.readlines()
    assert run.wait(timeout=60) == 130, "".join(said)
    progress = ("evenshard: list:", "evenshard: inspect:")
    own = [line for line in said if not line.startswith(progress)]
    assert own == [
        "evenshard convert: interrupted; run the same command again: it clears what this run left\n"
    ], "".join(said)
    deadline = time.monotonic() + 10
    while _ours(str(tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.1)  # the worker clients end as the server closes their sockets
    assert not _ours(str(tmpdir)), "a process of the interrupted convert is still running"
    assert not os.listdir(tmpdir)  # no socket folder, no Beam temp folder
    assert not (out / ".evenshard.lock").exists()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "inputs ->" in again.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fork_server", ["on", "off"])
def test_a_killed_worker_is_one_line_naming_it_and_its_signal(fork_server, folder_500, tmp_path):
    """A worker process killed (by the OOM killer, by anyone) while a local convert runs:
    one line naming the worker (the pid its progress lines give), the signal and what to
    do; exit code 1 (some 165 lines of Beam's thread tracebacks before)."""
    import re
    import signal

    exe = os.path.join(os.path.dirname(sys.executable), "evenshard")
    argv = [exe, "convert", f"--input={folder_500[0]}", f"--output_dir={tmp_path / 'out'}"]
    argv += ["--max_reject_fraction=0.05", *ARGS[1:]]
    env = dict(os.environ, EVENSHARD_PROGRESS_SECONDS="0")
    if fork_server == "off":
        env[forked_workers.ENV] = ""  # Beam's own worker processes
    run = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    said = []
    for line in run.stderr:  # a worker's first inspect line names its pid: kill it
        said.append(line)
        worker = re.search(r"^evenshard: inspect: .*worker (\d+)\)$", line)
        if worker:
            os.kill(int(worker.group(1)), signal.SIGKILL)
            break
    said += run.stderr.readlines()
    assert run.wait(timeout=60) == 1, "".join(said)
    own = [
        line for line in said if not line.startswith(("evenshard: list:", "evenshard: inspect:"))
    ]
    assert len(own) == 1, "".join(said)
    # Beam's own workers are started by a shell that keeps their pid: unnamed
    who = f"worker process {worker.group(1)} " if fork_server == "on" else "a worker process "
    assert own[0].startswith(f"evenshard convert: error: {who}"), own[0]
    assert "SIGKILL" in own[0] and "run the same command again" in own[0]
    assert not (tmp_path / "out" / ".evenshard.lock").exists()  # unwound: lock released


@pytest.mark.fast
def test_a_forked_worker_tries_pillows_common_formats_first():
    """The server's preload imports every Pillow plugin, the common formats' first: a
    worker opens a JPEG trying what a worker not forked tries (all of them by name would
    try twenty others first, IM's by reading the image)."""

    def plugins(code: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", f"{code}\nfrom PIL import Image\nprint(*Image.ID)"],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.split()

    preloaded = plugins("from beam_jobs.forked_workers import _preload\n_preload()")
    common = plugins("from PIL import Image\nImage.preinit()")
    assert preloaded[: len(common)] == common and "JPEG" in common
    assert len(preloaded) > len(common) + 10  # the rest imported ahead too
