"""evenshard convert on Dask (2 loopback workers) against the 2-worker DirectRunner.

35,000 generated JPEGs, the same flags, each run a process of its own, one
run each; the shards must come out byte-identical. Target (issue 11): Dask
within 2x of the DirectRunner.

    .venv/bin/python benchmarks/dask_bench.py [--images 35000]
"""

from __future__ import annotations

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BIN, WORK, bench_main, make_jpegs, run_measured, tiny, verdict  # noqa: E402

FLAGS = {
    "images": (int, 35_000, "JPEGs to generate and convert", 24),
}


def measure(a) -> dict:
    import schemas

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    runs, shas = {}, {}
    for name, flags in {
        "direct_2_workers": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        # --smoke: a LocalCluster of one worker process (the same path), not two, each
        # importing Beam afresh
        "dask_2_workers": ["--runner=dask", *tiny([], ["--dask_workers=1"])],
    }.items():
        out = os.path.join(WORK, f"dask_bench_{name}")
        cmd = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}", f"--output_dir={out}"]
        seconds, rss = run_measured([*cmd, "--overwrite", *flags])
        info = schemas.load_info(out)
        shas[name] = [sh["sha256"] for s in info["splits"].values() for sh in s["shards"]]
        shutil.rmtree(out, ignore_errors=True)
        runs[name] = {"seconds": round(seconds, 1), "peak_rss_mb": round(rss / 1e6)}
    result = {
        "images": a.images,
        "runs": runs,
        "dask_over_direct": runs["dask_2_workers"]["seconds"] / runs["direct_2_workers"]["seconds"],
        "same_bytes": shas["direct_2_workers"] == shas["dask_2_workers"],
    }
    return result


def render(d: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    r = d["runs"]
    ratio = d["dask_over_direct"]
    return f"""## convert on Dask — `benchmarks/dask_bench.py`

{d["images"]:,} generated JPEGs, the same flags, one run each.

| runner | wall (s) | peak RSS (MB) |
|---|---:|---:|
| DirectRunner, 2 worker processes | {r["direct_2_workers"]["seconds"]:.1f} | {r["direct_2_workers"]["peak_rss_mb"]:,} |
| `--runner=dask` (loopback LocalCluster, 2 workers) | {r["dask_2_workers"]["seconds"]:.1f} | {r["dask_2_workers"]["peak_rss_mb"]:,} |

Dask / DirectRunner: **{ratio:.2f}** (aim ≤ 2 — {verdict(ratio, 2)});
shards byte-identical: {"yes" if d["same_bytes"] else "NO"}.

`--runner=dask` runs `beam_jobs/dask_runner.py`, Beam's DaskRunner with
three fixes (HISTORY.md has the figures before them): every step that
several steps read is persisted on the cluster once, side inputs reach
tasks as computed lists (Beam's runner hands each task lazy bags that it
computes itself, the whole graph upstream again), Reshuffle repartitions
(Beam's is a no-op, so one worker inspected everything), and what a DoFn
emits in `finish_bundle` is kept (Beam's runner drops it).
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
