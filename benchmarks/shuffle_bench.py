"""Shuffle quality on a label-sorted dataset: evenshard against tf.data shuffle(buffer).

20,000 JPEGs in 10 label folders (a label-sorted input), converted with the
default options and with --balance label; read with reader.make_dataset and
measured by audit/mixing.py. Targets (recorded, not asserted):
- default conversion, default reader (1,000-example buffer): label mix <= 1.05
- --balance label, shuffle_buffer=0: label mix <= 0.5 (better than random)
- neighbour repeats <= 2x an independent permutation per epoch
- baseline tf.data shuffle(10_000) over the sorted file: reported

    .venv/bin/python benchmarks/shuffle_bench.py [--images 20000]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HERE, SMOKE, WORK, bench_main, convert_once, make_jpegs, tiny, verdict  # noqa: E402

FLAGS = {
    "images": (int, 20_000, "JPEGs in the label-sorted folder", 64),
}


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from audit.shuffle_report import report

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    default = os.path.join(WORK, f"shuffle_default_{a.images}")
    balanced = os.path.join(WORK, f"shuffle_balanced_{a.images}")
    default = convert_once(src, default)
    balanced = convert_once(src, balanced, "--balance=label")
    png = os.path.join(WORK if SMOKE else HERE, "shuffle_report.png")
    batch = dict(batch_size=tiny(256, 8))
    runs = {
        "default": report(default, out=png, baseline=True, baseline_buffer=10_000, **batch),
        "balanced_no_buffer": report(
            balanced, out=os.path.join(WORK, "balanced0.png"), shuffle_buffer=0, **batch
        ),
        "balanced_default_buffer": report(
            balanced, out=os.path.join(WORK, "balanced.png"), **batch
        ),
    }
    result = {
        "images": a.images,
        "png": os.path.relpath(png, HERE),
        "runs": runs,
    }
    return result


def render(s: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    rows = []
    for run_name, res in s["runs"].items():
        for pipe, m in res["results"].items():
            opts = json.dumps(res["reader_options"])
            rows.append(
                f"| {run_name} | {pipe} | {opts} | {m['label_mix_ratio']:.3f} | "
                f"{m['order_memory']:.3f} | {m.get('neighbour_repeats_vs_independent', 0):.2f}× |"
            )
    d = s["runs"]["default"]["results"]
    ours = d["evenshard reader"]
    base = next(v for k, v in d.items() if k != "evenshard reader")
    bal0 = s["runs"]["balanced_no_buffer"]["results"]["evenshard reader"]
    bal = s["runs"]["balanced_default_buffer"]["results"]["evenshard reader"]
    repeats = ours.get("neighbour_repeats_vs_independent", 0)
    table = "\n".join(rows)
    return f"""## shuffle quality — `benchmarks/shuffle_bench.py`

{s["images"]:,} JPEGs in 10 label folders: a **label-sorted** input. `default`
and `balanced_*` are converted with the default options and with
`--balance label`; the train split is read for two epochs, batch 256. Label
mix: 1.0 is a uniform random permutation, lower is better than random. Order
memory: Spearman against the source key order. Repeats: neighbour pairs of
epoch 1 adjacent again in epoch 2, against an independent permutation. The
default options make few shards of these small images (the train split's
{s["runs"]["default"]["num_examples"]:,} are far below the 128 MB target);
the reader still reads runs cut at new points every epoch (reader/order/plan.py),
so epochs differ with `shuffle_buffer=0` too.

| dataset | pipeline | reader options | label mix | order memory | repeats |
|---|---|---|---:|---:|---:|
{table}

| target | measured | aim |
|---|---:|---:|
| global shuffle, default reader: label mix | {ours["label_mix_ratio"]:.3f} | ≤ 1.05 — {verdict(ours["label_mix_ratio"], 1.05)} |
| `--balance label`, `shuffle_buffer=0`: label mix | {bal0["label_mix_ratio"]:.3f} | ≤ 0.5 — {verdict(bal0["label_mix_ratio"], 0.5)} |
| `--balance label`, default buffer: label mix | {bal["label_mix_ratio"]:.3f} | reported |
| baseline tf.data `shuffle(10000)` over the sorted file: label mix | {base["label_mix_ratio"]:.3f} | reported (far above 1) |
| neighbour repeats vs independent permutations | {repeats:.2f}× | ≤ 2× — {verdict(repeats, 2)} |

![shuffle report]({s["png"]})
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
