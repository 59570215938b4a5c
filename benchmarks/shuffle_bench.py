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

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HERE, WORK, convert_once, machine, make_jpegs  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=20_000)
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from audit.shuffle_report import report

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    default = os.path.join(WORK, f"shuffle_default_{a.images}")
    balanced = os.path.join(WORK, f"shuffle_balanced_{a.images}")
    convert_once(src, default)
    convert_once(src, balanced, "--balance=label")
    png = os.path.join(HERE, "shuffle_report.png")
    runs = {
        "default": report(default, out=png, baseline=True, baseline_buffer=10_000),
        "balanced_no_buffer": report(
            balanced, out=os.path.join(WORK, "balanced0.png"), shuffle_buffer=0
        ),
        "balanced_default_buffer": report(balanced, out=os.path.join(WORK, "balanced.png")),
    }
    result = {
        "machine": machine(),
        "images": a.images,
        "png": os.path.relpath(png, HERE),
        "runs": runs,
    }
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()
