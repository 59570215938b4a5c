"""The cost of the readers' decoding rules (docs/convert.md#decoding), A/B in one process.

(a) TensorFlow: decode + resize to 64x64 of 5,000 JPEGs with the accurate
IDCT (the rule) against TensorFlow's default fast one; (b) DALI on the CPU:
256 JPEGs in memory decoded + resized with the rule's arguments (orientation
off, fancy upsampling) against DALI's defaults, and against 16-bit output
divided by 256 (the exact 16-bit rule done in DALI, rejected for its cost).
Best of 3 rounds, round-robin; images per second.

    .venv/bin/python benchmarks/decode_bench.py
"""

from __future__ import annotations

import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, make_jpegs, tiny  # noqa: E402

IMAGES, ROUNDS, RUNS = tiny(5_000, 16), tiny(3, 1), tiny(20, 2)


def _tf_rates(files: list[str]) -> dict[str, float]:
    from schemas import storage

    tf = storage.tensorflow()
    data = tf.data.Dataset.from_tensor_slices([open(f, "rb").read() for f in files])
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for method in ("INTEGER_FAST", "INTEGER_ACCURATE"):

            def one(d, method=method):
                image = tf.io.decode_jpeg(d, channels=3, dct_method=method)
                return tf.image.resize(image, (64, 64))

            start = time.perf_counter()
            n = sum(1 for _ in data.map(one, num_parallel_calls=2))
            best[method] = max(best.get(method, 0.0), n / (time.perf_counter() - start))
    return best


def _dali_rates(files: list[str]) -> dict[str, float]:
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    encoded = [np.fromfile(f, np.uint8) for f in files[:256]]
    configs = {
        "dali_defaults": ({}, False),
        "rule": ({"adjust_orientation": False, "jpeg_fancy_upsampling": True}, False),
        "rule_16_bit_output": (
            {"adjust_orientation": False, "jpeg_fancy_upsampling": True, "dtype": types.UINT16},
            True,
        ),
    }

    def make(args, wide):
        @pipeline_def(
            batch_size=len(encoded), num_threads=2, device_id=None, prefetch_queue_depth=2
        )
        def pipe():
            data = fn.external_source(source=lambda: encoded, batch=True, dtype=types.UINT8)
            image = fn.decoders.image(data, device="cpu", output_type=types.RGB, **args)
            if wide:
                image = fn.cast(image // 256, dtype=types.UINT8)
            return fn.resize(image, resize_y=64, resize_x=64, antialias=False)

        p = pipe()
        p.build()
        p.run()
        return p

    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, (args, wide) in configs.items():
            p = make(args, wide)
            start = time.perf_counter()
            for _ in range(RUNS):
                p.run()
            rate = RUNS * len(encoded) / (time.perf_counter() - start)
            best[name] = max(best.get(name, 0.0), rate)
    return best


def measure(a) -> dict:
    src = make_jpegs(os.path.join(WORK, f"jpegs_{IMAGES}"), IMAGES)
    files = sorted(glob.glob(os.path.join(src, "*", "*.jpg")))
    tf_rates, dali_rates = _tf_rates(files), _dali_rates(files)
    result = {
        "tf_images_per_s": tf_rates,
        "tf_accurate_over_fast": tf_rates["INTEGER_ACCURATE"] / tf_rates["INTEGER_FAST"],
        "dali_images_per_s": dali_rates,
        "dali_rule_over_defaults": dali_rates["rule"] / dali_rates["dali_defaults"],
        "dali_16_bit_over_rule": dali_rates["rule_16_bit_output"] / dali_rates["rule"],
    }
    return result


def render(d: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    tf, dali = d["tf_images_per_s"], d["dali_images_per_s"]
    sixteen = d["dali_16_bit_over_rule"] * d["dali_rule_over_defaults"]
    return f"""## The cost of the decoding rules — `benchmarks/decode_bench.py`

Every reader gives the same pixels (docs/convert.md#decoding); what the rules
cost, A/B in one process, best of 3, images/s:

| decoder | configuration | images/s | ratio |
|---|---|---:|---:|
| TensorFlow, 5,000 JPEGs → 64×64 | default IDCT (`INTEGER_FAST`) | {tf["INTEGER_FAST"]:,.0f} | 1.00 |
| | the rule: `INTEGER_ACCURATE` | {tf["INTEGER_ACCURATE"]:,.0f} | {d["tf_accurate_over_fast"]:.2f} |
| DALI CPU, 256 JPEGs in memory → 64×64 | DALI's defaults | {dali["dali_defaults"]:,.0f} | 1.00 |
| | the rule: orientation off, fancy upsampling | {dali["rule"]:,.0f} | {d["dali_rule_over_defaults"]:.2f} |
| | + 16-bit output ÷ 256 (rejected) | {dali["rule_16_bit_output"]:,.0f} | {sixteen:.2f} |

The 16-bit output would make DALI's 16-bit PNGs exact for every image's cost;
instead the record source rewrites the rare 16-bit PNG as 8-bit
(`reader/decode/pydecode.py`, `eight_bit_png`).
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
