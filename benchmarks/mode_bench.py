"""Which local mode should be the default? In-memory (one core) against multi_processing (all
cores), and the default as shipped, on the same JPEG folders, round-robin, best of two.

    .venv/bin/python benchmarks/mode_bench.py [--sizes 2000,5000,35000]

Prints JSON; RESULTS.md quotes it. Ratios are to the better of the two explicit modes
(the issue's aim: the default within 10% of it, ratio <= 1.10).
"""

from __future__ import annotations

import os
import shutil

from _common import BIN, WORK, bench_main, make_jpegs, run_measured, table_rows, verdict

MODES = {
    "in_memory_1": ["--direct_running_mode=in_memory", "--direct_num_workers=1"],
    "multi_processing_all": [
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={os.cpu_count()}",
    ],
    "default": [],
}


FLAGS = {
    "sizes": (str, "2000,5000,35000", "comma list of folder sizes", "24"),
    "repeats": (int, 2, "runs of each mode, best kept", 1),
}


def measure(a) -> dict:
    result = {"seconds": {}, "ratio_default_to_best": {}}
    for n in (int(x) for x in a.sizes.split(",")):
        src = make_jpegs(os.path.join(WORK, f"jpegs_{n}"), n)
        best = {}
        for _ in range(a.repeats):
            for mode, flags in MODES.items():
                out = os.path.join(WORK, f"mode_{n}_{mode}")
                shutil.rmtree(out, ignore_errors=True)
                cmd = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}"]
                seconds, _ = run_measured([*cmd, f"--output_dir={out}", *flags])
                best[mode] = min(best.get(mode, seconds), seconds)
        result["seconds"][n] = {k: round(v, 2) for k, v in best.items()}
        better = min(best["in_memory_1"], best["multi_processing_all"])
        result["ratio_default_to_best"][n] = round(best["default"] / better, 3)
    return result


def render(mode: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    ratio = mode["ratio_default_to_best"]
    rows = table_rows(
        mode["seconds"].items(),
        lambda n, t: (
            [f"{int(n):,}"]
            + [f"{t[mode]:.1f}" for mode in ("in_memory_1", "multi_processing_all", "default")]
            + [f"**{ratio[n]:.2f}**", f"≤ 1.10 — {verdict(ratio[n], 1.10)}"]
        ),
    )
    return f"""## local mode — `benchmarks/mode_bench.py`

Which DirectRunner mode `evenshard convert` uses when no runner flag is given.
The same JPEG folders converted three ways, best of two, round-robin:
one in-memory worker (Beam's own default), `multi_processing` with a worker
a core, and the default as shipped (`beam_jobs/runners.py: local_default`).
Aim: the default within 10% of the better explicit mode (ratio ≤ 1.10).

| images | in_memory, 1 worker (s) | multi_processing, all cores (s) | default (s) | default / better | aim |
|---:|---:|---:|---:|---:|---|
{rows}
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
