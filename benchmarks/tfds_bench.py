"""evenshard convert against TFDS on the same folder (issue 11): wall, CPU and peak RSS.

The 20,000 generated JPEGs hard-linked 5 times (100,000 files, 10 labels),
each contender a process of its own, one after another, same files:
(a) the naive loop (read -> tf.train.Example -> TFRecordWriter, no checks);
(b) TFDS GeneratorBasedBuilder, single process (hash shuffle, no decode check);
(c) TFDS's Beam path (the builder's generator returns a PTransform), DirectRunner,
    2 worker processes; (d) evenshard convert --verify header, every core (the
    default runner); (e) evenshard convert --verify full.
Targets (RESULTS.md): d <= 1.0 b and <= 0.5 c; e <= 1.3 b with CPU >= 1.8 cores;
peak RSS of d and e <= b. TFDS is benchmark tooling only (``pip install
tensorflow-datasets``; ``make bench`` installs it), never a dependency of evenshard.

    .venv/bin/python benchmarks/tfds_bench.py [--copies 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BIN, HERE, WORK, machine, make_jpegs, measured  # noqa: E402

PY = sys.executable


def linked_copies(src: str, copies: int) -> str:
    """``copies`` hard-linked copies of every file of ``src`` under new names; cached."""
    out = os.path.join(WORK, f"jpegs_x{copies}")
    done = os.path.join(out, ".done")
    if os.path.exists(done):
        return out
    for label in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, label)):
            continue
        os.makedirs(os.path.join(out, label), exist_ok=True)
        for name in os.listdir(os.path.join(src, label)):
            for c in range(copies):
                os.link(os.path.join(src, label, name), os.path.join(out, label, f"c{c}_{name}"))
    open(done, "w").close()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--copies", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    src = linked_copies(make_jpegs(os.path.join(WORK, "jpegs_20000"), 20_000), a.copies)
    n = sum(len(fs) for _, _, fs in os.walk(src)) - 1  # less .done
    outs = os.path.join(WORK, "tfds_bench_out")
    shutil.rmtree(outs, ignore_errors=True)
    builder = os.path.join(HERE, "_tfds_builder.py")
    evenshard = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}"]
    contenders = {
        "a_naive": [
            PY,
            "-c",
            f"import sys; sys.path.insert(0, {HERE!r}); import os; os.makedirs({outs!r}); "
            "from convert_bench import naive_loop; from _common import list_images; "
            f"naive_loop(list_images({src!r}), {outs + '/a.tfrecord'!r})",
        ],
        "b_tfds_single": [PY, builder, src, f"{outs}/b", "single"],
        "c_tfds_beam": [PY, builder, src, f"{outs}/c", "beam"],
        "d_evenshard_header": [*evenshard, f"--output_dir={outs}/d", "--verify=header"],
        "e_evenshard_full": [*evenshard, f"--output_dir={outs}/e", "--verify=full"],
    }
    # Round-robin, best wall of ``rounds`` each (this machine's wall times move
    # by 10-30% between runs); TFDS's Beam path, 3x slower, runs once.
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for r in range(a.rounds):
        for name, cmd in contenders.items():
            if name == "c_tfds_beam" and r:
                continue
            shutil.rmtree(outs, ignore_errors=True)
            runs[name].append(measured(cmd, phases=name.startswith(("d_", "e_"))))
    results = {name: min(rs, key=lambda m: m["seconds"]) for name, rs in runs.items()}
    shutil.rmtree(outs, ignore_errors=True)
    b, c = results["b_tfds_single"], results["c_tfds_beam"]
    d, e = results["d_evenshard_header"], results["e_evenshard_full"]
    result = {
        "machine": machine(),
        "images": n,
        "rounds": a.rounds,
        "results": results,
        "all_runs": runs,
        "header_over_tfds": d["seconds"] / b["seconds"],
        "header_over_tfds_beam": d["seconds"] / c["seconds"],
        "full_over_tfds": e["seconds"] / b["seconds"],
        "full_cores": e["cores_used"],
        "rss_over_tfds": max(d["peak_rss_mb"], e["peak_rss_mb"]) / b["peak_rss_mb"],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
