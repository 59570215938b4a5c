"""benchmarks/gpu_check.py at its smoke size: without a GPU it skips the GPU routes,
saying why, and checks the CPU ones (every image once, the same pixels); with one it
checks them all. Its rates are never checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def test_gpu_check_runs_and_skips_what_it_cannot_run(tmp_path):
    env = dict(os.environ, EVENSHARD_BENCH_WORK=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, str(CHECK), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        cwd=CHECK.parent.parent,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout[done.stdout.index("{") :])
    assert out["ok"] and out["cpu_limit"] > 0
    routes = {"dali_gpu", "tf_prefetch_to_device", "numpy_pinned", "nvjpeg_ceiling"}
    assert routes == set(out["routes"]) - {"tf_cpu", "numpy_cpu"} | set(out["skipped"])
    for name, why in out["skipped"].items():
        assert f"skipped {name}: {why}" in done.stderr
    cpu = out["routes"]["numpy_cpu"]
    assert cpu["problems"] == [] and cpu["max_diff"] == 0
