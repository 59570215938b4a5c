"""Decode + resize rates of the DALI and PyTorch readers against the tf.data reader.

The same 20,000 JPEGs in 16 shards as read_bench, decode + resize to 64x64,
batch 256, one epoch a pass, best of 3 passes measured round-robin:
(a) reader.make_dataset (tf.data), (b) reader.make_dali_pipeline on the CPU,
(c) reader.torch.TorchReader with the DALI backend, (d) with the tf.data
backend, (e) reader.records.source.RecordSource alone (fetch by DALI index
offset + parse, no decode): the rate at which Python feeds DALI, and (f)
DALI's own limit: the same DALI decode + resize over one batch of encoded
bytes in memory, fed again and again.

    .venv/bin/python benchmarks/frameworks_bench.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, make_jpegs, tiny  # noqa: E402

SIZE = (64, 64)
BATCH = tiny(256, 8)
IMAGES = tiny(20_000, 64)  # --smoke: the JPEGs and conversion other smokes read


def one_pass(make, n_expected: int) -> float:
    """Records/s of one full pass over a freshly made reader."""
    reader = make()
    start = time.perf_counter()
    n = 0
    for batch in reader:
        n += len(batch["key"] if isinstance(batch, dict) else batch.key)
    if n != n_expected:
        raise RuntimeError(f"read {n} records, expected {n_expected}")
    return n / (time.perf_counter() - start)


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reader
    from reader.dali import make_dali_pipeline
    from reader.records.source import RecordSource
    from reader.torch import TorchReader

    src = make_jpegs(os.path.join(WORK, f"jpegs_{IMAGES}"), IMAGES)
    data_dir = convert_once(
        src, os.path.join(WORK, f"read_{IMAGES}"), "--splits=train=1.0", "--num_shards=16"
    )
    n = reader.load_info(data_dir).split("train").num_examples
    common = dict(image_size=SIZE, seed=0)
    pipelines = {
        "a_tf_data": lambda: reader.make_dataset(data_dir, "train", BATCH, **common),
        "b_dali_cpu": lambda: make_dali_pipeline(data_dir, "train", BATCH, device="cpu", **common),
        "c_torch_dali_cpu": lambda: TorchReader(data_dir, "train", BATCH, backend="dali", **common),
        "d_torch_tf": lambda: TorchReader(data_dir, "train", BATCH, backend="tf", **common),
        "e_record_source": lambda: RecordSource(
            data_dir, "train", BATCH, reader.ReadOptions(**common)
        ),
    }
    pipelines["f_dali_in_memory"] = lambda: _dali_in_memory(src, n)
    best = dict.fromkeys(pipelines, 0.0)
    for _ in range(tiny(3, 1)):
        for name, make in pipelines.items():
            best[name] = max(best[name], one_pass(make, n))
    result = {
        "images": n,
        "records_per_s": best,
        "ratios_to_tf_data": {k: best[k] / best["a_tf_data"] for k in best},
        "gpu": "none: no GPU was lent to this work (the device tool's status)",
    }
    return result


def _dali_in_memory(src: str, n: int):
    """DALI decode + resize of one batch of encoded JPEGs held in memory, n records' worth."""
    import numpy as np
    from _common import list_images
    from nvidia.dali import fn, pipeline_def, types

    encoded = [np.fromfile(path, np.uint8) for path, _ in list_images(src)[:BATCH]]

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, prefetch_queue_depth=2)
    def pipe():
        data = fn.external_source(source=lambda: encoded, batch=True, dtype=types.UINT8)
        images = fn.decoders.image(data, device="cpu", output_type=types.RGB)
        return fn.resize(images, resize_y=SIZE[0], resize_x=SIZE[1], antialias=False)

    p = pipe()
    p.build()
    for _ in range(n // BATCH):
        p.run()
        yield {"key": [None] * BATCH}
    yield {"key": [None] * (n % BATCH)}


NAMES = {
    "a_tf_data": "`reader.make_dataset` (tf.data)",
    "b_dali_cpu": '`reader.make_dali_pipeline(device="cpu")`',
    "c_torch_dali_cpu": "`reader.torch.TorchReader`, DALI backend (CPU)",
    "d_torch_tf": "`reader.torch.TorchReader`, tf.data backend",
    "e_record_source": "`reader.records.source.RecordSource` alone: fetch + parse, no decode",
    "f_dali_in_memory": "DALI decode + resize over encoded bytes in memory (DALI's limit)",
}


def render(f: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    rates = f["records_per_s"]
    rows = "\n".join(
        f"| {k[0]} | {NAMES[k]} | {v:,.0f} | {f['ratios_to_tf_data'][k]:.2f} |"
        for k, v in rates.items()
    )
    return f"""## DALI and PyTorch readers — `benchmarks/frameworks_bench.py`

The same {f["images"]:,} JPEGs in 16 shards as the reader section, decode + resize to
64×64, batch 256, seed 0; each reader made anew and read for one epoch, best of
3 passes, round-robin. All read the same records in the same order.

| | reader | records/s | / tf.data |
|---|---|---:|---:|
{rows}

The DALI reader runs at {rates["b_dali_cpu"] / rates["f_dali_in_memory"]:.2f} of DALI's own
decode + resize over bytes in memory (f): Python fetches the next batch while
DALI decodes this one (an external source DALI pulls ahead of its runs).

GPU: {f["gpu"]}.
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
