"""Training feed rate of TorchReader inside a PyTorch training loop, by torch thread count.

A tiny CNN trains for 2 epochs on 5,000 JPEGs (decode + resize to 32x32,
batch 64) read by TorchReader with the tf.data backend and the DALI
backend, with ``torch.set_num_threads(1)`` and with PyTorch's default (one
thread a core). Each configuration runs in its own process (thread pools
are per process), twice, best kept; the figure is images trained per second
after the first batch (``first_batch_s``: building the pipeline, which
TorchReader does on the first ``iter()``, and its first batch).

    .venv/bin/python benchmarks/train_bench.py
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, make_jpegs, run_command, tiny  # noqa: E402

IMAGES = tiny(5_000, 32)

ONE_RUN = r"""
import json, sys, time
import torch
backend, threads, data_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if threads:
    torch.set_num_threads(threads)
from reader.torch import TorchReader
start = time.perf_counter()
r = TorchReader(data_dir, "train", 64, image_size=(32, 32), seed=0, epochs=2, backend=backend,
                layout="NCHW")
built = time.perf_counter() - start
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n, start, first = 0, time.perf_counter(), None
for batch in r:
    if first is None:  # the pipeline is built on the first iter(): TensorFlow or DALI starts
        first, start = time.perf_counter() - start, time.perf_counter()
    else:
        n += len(batch["key"])
    x = batch["image"].float() / 255
    loss = torch.nn.functional.cross_entropy(model(x), batch["label"])
    opt.zero_grad(); loss.backward(); opt.step()
print(json.dumps({"images_per_s": n / (time.perf_counter() - start), "build_s": built,
                  "first_batch_s": first, "torch_threads": torch.get_num_threads()}))
"""


def run(backend: str, threads: int, data_dir: str) -> dict:
    printed = run_command([sys.executable, "-c", ONE_RUN, backend, str(threads), data_dir])
    return json.loads(printed.strip().splitlines()[-1])


def measure(a) -> dict:
    src = make_jpegs(os.path.join(WORK, f"jpegs_{IMAGES}"), IMAGES)
    data_dir = convert_once(
        src, os.path.join(WORK, f"train_{IMAGES}"), "--splits=train=1.0", "--num_shards=8"
    )
    best: dict[str, dict] = {}
    for _ in range(tiny(2, 1)):
        for backend in tiny(("tf", "dali"), ("tf",)):  # --smoke: DALI's is frameworks_bench's
            for threads in tiny((1, 0), (1,)):
                name = f"{backend}, torch threads {'1' if threads else 'default'}"
                r = run(backend, threads, data_dir)
                if name not in best or r["images_per_s"] > best[name]["images_per_s"]:
                    best[name] = r
    result = {"images": IMAGES, "epochs": 2, "runs": best}
    return result


def render(t: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    runs = t["runs"]
    rows = "\n".join(
        f"| {name} | {r['torch_threads']} | {r['images_per_s']:,.0f} | {r['first_batch_s']:.1f} |"
        for name, r in runs.items()
    )

    def ratio(backend: str) -> float:
        return (
            runs[f"{backend}, torch threads default"]["images_per_s"]
            / runs[f"{backend}, torch threads 1"]["images_per_s"]
        )

    return f"""## Training with TorchReader — `benchmarks/train_bench.py`

A tiny CNN (two conv layers) trains for {t["epochs"]} epochs on {t["images"]:,} JPEGs
(32×32, batch 64) read by `TorchReader`, each configuration in its own process,
best of 2. Images trained a second after the first batch; "first batch" is
the seconds from the first `iter()` to the first batch: the pipeline is built
there (TensorFlow's import and tracing the tf.data graph; DALI's build).

| configuration | torch threads | images/s | first batch (s) |
|---|---:|---:|---:|
{rows}

PyTorch's default thread count (one a core) against 1 thread, this run: tf.data
backend {ratio("tf"):.2f}×, DALI backend {ratio("dali"):.2f}×. Runs of one configuration
differ by up to a quarter on a 2-core machine, so a ratio near 1 is within the
noise (HISTORY.md). Where the reader shares few cores with the model, measure
`torch.set_num_threads(cores - 1)` against the default.
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
