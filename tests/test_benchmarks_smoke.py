"""Every benchmark runs at a tiny size (``--smoke``) with its checks, so none can rot
unnoticed; none imports a private name of the project. Timings are never checked.

A contender whose package is not installed here (the peers' own environment, TFDS)
is left out by the benchmark in smoke mode and named, with why, in its
``smoke_skipped``; every other contender runs.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
NAMES = sorted(p.name[: -len("_bench.py")] for p in BENCHMARKS.glob("*_bench.py"))
PROJECT = {"reader", "beam_jobs", "schemas", "audit", "evenshard"}


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


def _smoke(name: str, work: Path) -> tuple[int, str, str]:
    env = dict(
        os.environ,
        EVENSHARD_BENCH_WORK=str(work / name),
        # JPEG folders and conversions two benchmarks ask for alike are made once
        EVENSHARD_BENCH_SHARED=str(work / "shared"),
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}_bench.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        cwd=BENCHMARKS.parent,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Every benchmark's smoke run, two at a time (the machine has 2 cores), the
    longest first."""
    work, before = tmp_path_factory.mktemp("bench"), _written()
    order = sorted(NAMES, key=lambda name: name not in ("convert", "peers", "dask", "bucket"))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = dict(zip(order, pool.map(lambda name: _smoke(name, work), order)))
    return runs, before, _written()


@pytest.mark.parametrize("name", NAMES)
def test_the_benchmark_runs_at_a_tiny_size(smoke_runs, name):
    code, out, err = smoke_runs[0][name]
    assert code == 0, f"{name}_bench.py --smoke failed:\n{err[-3000:]}"
    result = json.loads(out[out.index("{") :])
    assert result["machine"]
    for contender, why in result.get("smoke_skipped", {}).items():
        assert "not installed" in why, (contender, why)


def _written() -> dict[str, int]:
    """The benchmarks' results (JSON, RESULTS.md, figures) and when each was written."""
    kept = (".json", ".md", ".png")
    return {p.name: p.stat().st_mtime_ns for p in BENCHMARKS.iterdir() if p.suffix in kept}


def test_a_smoke_run_writes_no_results(smoke_runs):
    _, before, after = smoke_runs
    assert after == before
