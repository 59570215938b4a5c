"""Convert from and to an S3 bucket: the CPU one way to storage costs (issue 56).

Against moto's S3 server on loopback (``evenshard.emulator``): 2,000 JPEGs uploaded to
``s3://bench/photos``, converted to ``s3://bench/out`` (two splits, 8 shards each),
each contender a process of its own, round-robin, ``--rounds`` times:
- ``s3``: ``evenshard convert`` of this checkout, bucket to bucket;
- ``local``: the same convert of the same images, local folder to local folder
  (the yardstick: the ratio s3 / local is what the bucket costs);
- ``s3_baseline`` (with ``--baseline REF``): convert as of that git commit, bucket to
  bucket, for a before/after in one sitting.
CPU seconds are user + system of each convert and its worker processes (``getrusage``
of the children); the server's own CPU (``/proc``) is reported beside them: it
grows with the requests a convert makes. Best of the rounds.

    .venv/bin/python benchmarks/storage_bench.py [--images 2000] [--baseline REF]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    SMOKE,
    WORK,
    bench_main,
    git_tree,
    make_jpegs,
    run_here,
    runs_here,
    table_rows,
)

_CLI = "import sys; sys.argv[0] = 'evenshard'; from evenshard.cli import run; run()"
FLAGS_OF_RUN = ("--splits=train=0.9,val=0.1", "--num_shards=8", "--overwrite")


def _cpu_of(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_pid() -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"moto.server" in f.read():
                    return int(pid)
        except OSError:
            continue
    return None


def _run(cmd: list[str], cwd: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of a convert and its children; under ``--smoke`` one of this
    checkout runs here (checked, its figures meaningless)."""
    if runs_here(cmd, cwd):
        start, cpu = time.perf_counter(), time.process_time()
        run_here(cmd)
        return time.perf_counter() - start, time.process_time() - cpu
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(a) -> dict:
    from evenshard.emulator import s3_server

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    mine = [os.path.join(os.path.dirname(sys.executable), "evenshard")]
    if not SMOKE:
        mine = [sys.executable, "-c", _CLI]
    loads = [os.getloadavg()[0]]
    with s3_server() as client:
        client.create_bucket(Bucket="bench")
        for folder, _, files in os.walk(src):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), src)
                client.upload_file(os.path.join(folder, name), "bench", f"photos/{rel}")
        server = _server_pid()
        bucket = ["convert", "--input=s3://bench/photos", *FLAGS_OF_RUN]
        contenders = {
            "s3": ([*mine, *bucket, "--output_dir=s3://bench/out"], None),
            "local": (
                [*mine, "convert", f"--input={src}", *FLAGS_OF_RUN, f"--output_dir={WORK}/s_out"],
                None,
            ),
        }
        if a.baseline:
            tree = git_tree(a.baseline, os.path.join(WORK, "storage_baseline_tree"))
            old = [sys.executable, "-c", _CLI, *bucket, "--output_dir=s3://bench/out_old"]
            contenders["s3_baseline"] = (old, tree)
        runs: dict[str, list] = {k: [] for k in contenders}
        for _ in range(a.rounds):
            for name, (cmd, cwd) in contenders.items():
                before = _cpu_of(server) if server else 0.0
                wall, cpu = _run(cmd, cwd)
                served = (_cpu_of(server) - before) if server else 0.0
                runs[name].append([round(wall, 2), round(cpu, 2), round(served, 2)])
            loads.append(os.getloadavg()[0])
    best = {k: {"wall": min(r[0] for r in v), "cpu": min(r[1] for r in v)} for k, v in runs.items()}
    for k, v in runs.items():
        best[k]["server_cpu"] = min(r[2] for r in v)
    return {
        "images": a.images,
        "rounds": a.rounds,
        "baseline": a.baseline,
        "load_1min": [round(x, 1) for x in loads],
        "runs": runs,
        "best": best,
        "s3_over_local_cpu": round(best["s3"]["cpu"] / best["local"]["cpu"], 2),
    }


def render(r: dict) -> str:
    names = {
        "s3": "`evenshard convert` bucket to bucket",
        "local": "the same, local folder to local folder",
        "s3_baseline": f"bucket to bucket as of {r.get('baseline')}",
    }
    rows = table_rows(
        r["best"].items(),
        lambda k, v: [
            names.get(k, k),
            f"{v['wall']:.1f}",
            f"{v['cpu']:.1f}",
            f"{v['server_cpu']:.1f}",
        ],
    )
    return f"""## convert from and to a bucket — `benchmarks/storage_bench.py`

{r["images"]:,} JPEGs on moto's S3 server on loopback, two splits of 8 shards, best of
{r["rounds"]} rounds round-robin (1-minute load {r["load_1min"]}). CPU: the convert and
its worker processes (`getrusage`); the server's beside it.

| contender | wall s | CPU s | server CPU s |
|---|---|---|---|
{rows}

Bucket over local CPU: **{r["s3_over_local_cpu"]}x**.{_against_baseline(r)}
"""


def _against_baseline(r: dict) -> str:
    old = r["best"].get("s3_baseline")
    if not old:
        return ""
    ratio = r["best"]["s3"]["cpu"] / old["cpu"]
    return f" Bucket to bucket over the same as of {r['baseline']}: **{ratio:.2f}x** the CPU."


FLAGS = {
    "images": (int, 2_000, "JPEGs to convert", 8),
    "rounds": (int, 3, "round-robin rounds (best of them)", 1),
    "baseline": (str, "", "a git commit whose convert runs too (bucket to bucket)", ""),
}

if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
