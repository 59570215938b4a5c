"""Every benchmark runs at a tiny size (``--smoke``) with its checks, so none can rot
unnoticed, and so does the GPU check (``gpu_check.py``), which on a machine without a
GPU skips the GPU routes, saying why, and checks the CPU ones; none imports a private
name of the project. Timings and rates are never checked.

A contender whose package is not installed here (the peers' own environment, TFDS)
is left out by the benchmark in smoke mode and named, with why, in its
``smoke_skipped``; every other contender runs.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import queue
import select
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
NAMES = sorted(p.name[: -len("_bench.py")] for p in BENCHMARKS.glob("*_bench.py"))
SCRIPTS = [f"{name}_bench.py" for name in NAMES] + ["gpu_check.py"]
PROJECT = {"reader", "convert_core", "beam_jobs", "schemas", "audit", "evenshard"}


def _private_uses(path: Path) -> list[str]:
    """``module.name`` of each private name of the project a file imports or uses."""
    tree = ast.parse(path.read_text())
    found, modules = [], set()  # names bound to the project's modules
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    modules.add(alias.asname or alias.name.split(".")[0])
                    found += [alias.name for part in alias.name.split(".") if part[0] == "_"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in PROJECT:
                continue
            found += [node.module for part in node.module.split(".") if part[0] == "_"]
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)  # a module or not: checked alike
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.fast
def test_no_benchmark_imports_a_private_name_of_the_project():
    used = {p.name: _private_uses(p) for p in sorted(BENCHMARKS.glob("*.py"))}
    assert not {name: names for name, names in used.items() if names}


@pytest.mark.fast
def test_run_all_runs_every_benchmark():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import run_all
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert sorted(run_all.BENCHES) == NAMES


# A runner process runs smokes one after another, each script named on its stdin, and
# answers each with its exit code: every benchmark imports TensorFlow or Beam (3-6 CPU
# seconds), once a runner instead of once a smoke. Each smoke gets what its own
# process would: its argv and environment, the benchmarks' modules imported afresh
# (``_common`` reads them when imported), its stdout and stderr in files of its own.
RUNNER = r"""
import os, runpy, sys, traceback
bench, work = sys.argv[1:3]
env, path, answer = dict(os.environ), list(sys.path), os.fdopen(os.dup(1), "w")
names = os.fdopen(os.dup(0))  # this process's own: no process a smoke starts reads it
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
for name in iter(names.readline, ""):
    name = name.strip()
    os.environ.clear()
    os.environ.update(env, TF_CPP_MIN_LOG_LEVEL="3", EVENSHARD_BENCH_WORK=f"{work}/{name[:-3]}")
    # JPEG folders and conversions two benchmarks ask for alike are made once
    os.environ["EVENSHARD_BENCH_SHARED"] = f"{work}/shared"
    for module in [m for m, v in sys.modules.items() if getattr(v, "__file__", None)]:
        if os.path.dirname(sys.modules[module].__file__) == bench:
            del sys.modules[module]
    sys.path[:] = [bench, *path[1:]]  # a script's folder first, in place of -c's ""
    sys.argv, code = [f"{bench}/{name}", "--smoke"], 0
    for fd, suffix in ((1, "out"), (2, "err")):
        (sys.stdout, sys.stderr)[fd - 1].flush()
        with open(f"{work}/{name}.{suffix}", "w") as f:
            os.dup2(f.fileno(), fd)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    print(code, file=answer, flush=True)
"""


def _runner(work: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(BENCHMARKS), str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=BENCHMARKS.parent,
    )


def _smokes(names: queue.Queue, work: Path) -> dict[str, tuple[int, str, str]]:
    """Smokes taken from ``names`` until none is left, one at a time in a runner; one
    that does not answer in 300 s, or ends the runner, fails and a new runner goes on."""
    runs, proc = {}, _runner(work)
    while True:
        try:
            name = names.get_nowait()
        except queue.Empty:
            break
        proc.stdin.write(name + "\n")
        proc.stdin.flush()
        ready = select.select([proc.stdout], [], [], 300)[0]
        answer = proc.stdout.readline() if ready else ""
        if not answer:
            proc.kill()
            proc.wait()
            proc = _runner(work)
        out, err = ((work / f"{name}.{s}").read_text() for s in ("out", "err"))
        runs[name] = (int(answer) if answer else -1, out, err + ("" if ready else "timed out"))
    proc.stdin.close()
    try:  # the runner's exit (atexit hooks, pools joined) counts for the smoke it ran last
        ended = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        ended = proc.wait()
    if ended != 0 and runs:
        last = list(runs)[-1]
        code, out, err = runs[last]
        runs[last] = (code or ended, out, f"{err}\nits runner exited {ended} after it")
    return runs


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Every script's smoke run, by its file name, two runners at a time (the machine
    has 2 cores), the longest first."""
    work, before = tmp_path_factory.mktemp("bench"), _written()
    names: queue.Queue = queue.Queue()
    first = {f"{n}_bench.py" for n in ("convert", "peers", "dask", "bucket")} | {"gpu_check.py"}
    for name in sorted(SCRIPTS, key=lambda name: name not in first):
        names.put(name)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {}
        for done in pool.map(lambda _: _smokes(names, work), range(2)):
            runs.update(done)
    return runs, before, _written()


@pytest.mark.parametrize("name", NAMES)
def test_the_benchmark_runs_at_a_tiny_size(smoke_runs, name):
    code, out, err = smoke_runs[0][f"{name}_bench.py"]
    assert code == 0, f"{name}_bench.py --smoke failed:\n{err[-3000:]}"
    result = json.loads(out[out.index("{") :])
    assert result["machine"]
    for contender, why in result.get("smoke_skipped", {}).items():
        assert "not installed" in why, (contender, why)


def test_gpu_check_runs_and_skips_what_it_cannot_run(smoke_runs):
    """Without a GPU it skips the GPU routes, saying why, and checks the CPU ones (every
    image once, the same pixels); with one it checks them all."""
    code, out, err = smoke_runs[0]["gpu_check.py"]
    assert code == 0, err[-3000:]
    out = json.loads(out[out.index("{") :])
    assert out["ok"] and out["cpu_limit"] > 0
    routes = {"dali_gpu", "tf_prefetch_to_device", "numpy_pinned", "torch_device", "nvjpeg_ceiling"}
    assert routes == set(out["routes"]) - {"tf_cpu", "numpy_cpu"} | set(out["skipped"])
    for name, why in out["skipped"].items():
        assert f"skipped {name}: {why}" in err
    cpu = out["routes"]["numpy_cpu"]
    assert cpu["problems"] == [] and cpu["max_diff"] == 0


def _written() -> dict[str, int]:
    """The benchmarks' results (JSON, RESULTS.md, figures) and when each was written."""
    kept = (".json", ".md", ".png")
    return {p.name: p.stat().st_mtime_ns for p in BENCHMARKS.iterdir() if p.suffix in kept}


def test_a_smoke_run_writes_no_results(smoke_runs):
    _, before, after = smoke_runs
    assert after == before
