"""Wall time and peak RSS of convert against the number of inputs (issue 11's curve).

Path records (``--record_kind=path``), ``--verify header``, the default
runner (every core), on 10,000, 100,000 and 500,000 files: hard links that
cycle over the 20,000 generated JPEGs. Linear time shows as a flat time per
example; bounded memory as a small RSS growth per example. At each size TFDS's
single-process builder (``_tfds_builder.py``, image records: the only kind it
has) runs on the same folder for its peak RSS, the issue's memory bar.

    .venv/bin/python benchmarks/scale_bench.py [--sizes 10000,100000,500000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BIN, HERE, WORK, list_images, machine, make_jpegs, measured  # noqa: E402


def linked(n: int) -> str:
    """A folder of ``n`` hard links cycling over the generated JPEGs (10 labels); cached."""
    out = os.path.join(WORK, f"links_{n}")
    if os.path.exists(os.path.join(out, ".done")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    files = list_images(make_jpegs(os.path.join(WORK, "jpegs_20000"), 20_000))
    for i in range(n):
        path, label = files[i % len(files)]
        os.makedirs(os.path.join(out, label), exist_ok=True)
        os.link(path, os.path.join(out, label, f"{i:07d}.jpg"))
    open(os.path.join(out, ".done"), "w").close()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,100000,500000")
    a = p.parse_args(argv)
    runs = {}
    for n in (int(x) for x in a.sizes.split(",")):
        src, out = linked(n), os.path.join(WORK, "scale_out")
        cmd = [
            os.path.join(BIN, "evenshard"),
            "convert",
            f"--input={src}",
            f"--output_dir={out}",
            "--record_kind=path",
            "--verify=header",
            "--overwrite",
        ]
        m = measured(cmd)
        shutil.rmtree(out, ignore_errors=True)
        tfds = measured(
            [sys.executable, os.path.join(HERE, "_tfds_builder.py"), src, out, "single"]
        )
        shutil.rmtree(out, ignore_errors=True)
        runs[n] = {
            **m,
            "us_per_example": round(m["seconds"] / n * 1e6, 1),
            "tfds_seconds": tfds["seconds"],
            "tfds_peak_rss_mb": tfds["peak_rss_mb"],
        }
    sizes = sorted(runs)
    lo, hi = sizes[0], sizes[-1]
    result = {
        "machine": machine(),
        "runs": runs,
        "rss_growth_bytes_per_example": (runs[hi]["peak_rss_mb"] - runs[lo]["peak_rss_mb"])
        * 1e6
        / (hi - lo),
        "marginal_us_per_example": (runs[hi]["seconds"] - runs[lo]["seconds"]) / (hi - lo) * 1e6,
        "rss_over_tfds": {n: r["peak_rss_mb"] / r["tfds_peak_rss_mb"] for n, r in runs.items()},
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
