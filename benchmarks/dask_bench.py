"""evenshard convert on Dask (2 loopback workers) against the 2-worker DirectRunner.

35,000 generated JPEGs, the same flags, each run a process of its own, one
run each; the shards must come out byte-identical. Target (issue 11): Dask
within 2x of the DirectRunner.

    .venv/bin/python benchmarks/dask_bench.py [--images 35000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BIN, WORK, machine, make_jpegs, run_measured  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=35_000)
    a = p.parse_args(argv)
    import schemas

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    runs, shas = {}, {}
    for name, flags in {
        "direct_2_workers": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        "dask_2_workers": ["--runner=dask"],
    }.items():
        out = os.path.join(WORK, f"dask_bench_{name}")
        cmd = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}", f"--output_dir={out}"]
        seconds, rss = run_measured([*cmd, "--overwrite", *flags])
        info = schemas.load_info(out)
        shas[name] = [sh["sha256"] for s in info["splits"].values() for sh in s["shards"]]
        shutil.rmtree(out, ignore_errors=True)
        runs[name] = {"seconds": round(seconds, 1), "peak_rss_mb": round(rss / 1e6)}
    result = {
        "machine": machine(),
        "images": a.images,
        "runs": runs,
        "dask_over_direct": runs["dask_2_workers"]["seconds"] / runs["direct_2_workers"]["seconds"],
        "same_bytes": shas["direct_2_workers"] == shas["dask_2_workers"],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
