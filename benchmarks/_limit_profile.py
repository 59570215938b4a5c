"""Where a reader's time goes: CPU microseconds an image, stage by stage, for
``make_dataset`` and ``NumpyReader`` (for docs/design.md, "Where a reader's time goes").

    .venv/bin/python benchmarks/_limit_profile.py DATA SIZE [ROUNDS [STAGES]]   # JSON on stdout

STAGES: a comma list of the runs below (all by default), e.g. ``np_workers``.

DATA: a converted dataset (one split, "train"), e.g. benchmarks/_work/limit_4000_out
(``limit_bench.py`` makes it). Each stage is a whole epoch with the public API, its CPU
time (every thread and, for worker processes, every process of the tree) over its
images, and "steady": from its first batch on (making the pipeline left out); the
lowest of ROUNDS rounds (others' work on a shared machine adds, never takes
away). Stages are differences of these runs:

* tf.data: records (``decode=False``: read, parse, batch the bytes, the consumer's
  ``.numpy()``), the decode + resize alone (``reader.decode.pixels`` on one thread over the
  same bytes), the whole read at SIZE; the rest = whole - records - decode (the batch's
  crossing into Python and back, stacking, tf.data's threads).
* NumpyReader: in-process (``num_processes=0``: fetch by offset, parse in Python,
  decode, resize, stack), with worker processes (the cores): crossing = that -
  in-process (pickling the bytes to the workers, the shared-memory block, the pool),
  and the consumer's own share of it. (Its records alone were ``decode=False``, which
  ``NumpyReader`` now refuses.)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import _tree_cpu  # noqa: E402

BATCH = 128


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run(batches) -> tuple[float, float, float, int, float, float]:
    """(tree CPU s, own CPU s, wall s, images, steady tree CPU s an image, steady own
    CPU s an image) of one epoch of ``batches``; steady: from the first batch on (the
    pipeline's making left out)."""
    pid, n = os.getpid(), 0
    cpu0, own0, t0 = sum(_tree_cpu(pid).values()), _self_cpu(), time.perf_counter()
    last = first = cpu0
    first_n, own_first = 0, own0
    for _images, count in batches:
        n += count
        last = sum(_tree_cpu(pid).values())  # the workers live until the read ends
        if not first_n:
            first, first_n, own_first = last, n, _self_cpu()
    steady = (last - first) / max(n - first_n, 1)
    own = _self_cpu()
    own_steady = (own - own_first) / max(n - first_n, 1)
    return last - cpu0, own - own0, time.perf_counter() - t0, n, steady, own_steady


def main(data: str, size: int, rounds: int, stages: str = "") -> dict:
    import numpy as np

    import reader
    from reader.decode import pixels
    from reader.pipeline import make_dataset  # noqa: F401 (imported before the clocks)

    kw = dict(seed=0, epochs=1)
    sized = dict(kw, image_size=(size, size))

    def tf_records():
        for b in reader.make_dataset(data, "train", BATCH, decode=False, **kw):
            yield b["image"].numpy(), len(b["key"])

    def tf_whole():
        for b in reader.make_dataset(data, "train", BATCH, **sized):
            yield b["image"].numpy(), len(b["key"])

    def np_reader(processes, **more):
        r = reader.NumpyReader(data, "train", BATCH, num_processes=processes, **more)
        for b in r:
            yield b["image"], len(b["key"])

    encoded = [e for batch, _ in tf_records() for e in batch]

    def decode_only():
        for i in range(0, len(encoded), BATCH):
            part = encoded[i : i + BATCH]
            for e in part:
                pixels.resize(pixels.decode(e, 3), (size, size))
            yield None, len(part)

    def copy_only():  # the consumer's copy of a batch of pixels (``.numpy()``, copy-out)
        batch = np.zeros((BATCH, size, size, 3), np.uint8)
        for i in range(0, len(encoded), BATCH):
            batch.copy()
            yield None, min(BATCH, len(encoded) - i)

    runs = {
        "tf_records": tf_records,
        "tf_whole": tf_whole,
        "decode_resize_1_thread": decode_only,
        "batch_copy": copy_only,
        "np_in_process": lambda: np_reader(0, **sized),
        "np_workers": lambda: np_reader(os.cpu_count(), **sized),
    }
    if stages:
        runs = {name: runs[name] for name in stages.split(",")}
    best: dict = {}
    for _ in range(rounds):
        for name, fn in runs.items():
            tree, own, wall, n, steady, own_steady = _run(fn())
            us = (1e6 * tree / n, 1e6 * own / n, n / wall, 1e6 * steady, 1e6 * own_steady)
            if name not in best or us[0] < best[name][0]:
                best[name] = us
    cpu = {k: round(v[0]) for k, v in best.items()}
    return {
        "size": size,
        "images": len(encoded),
        "rounds": rounds,
        "cpu_us_per_image": cpu,
        "consumer_us_per_image": {k: round(v[1]) for k, v in best.items()},
        "steady_cpu_us_per_image": {k: round(v[3]) for k, v in best.items()},
        "steady_consumer_us_per_image": {k: round(v[4]) for k, v in best.items()},
        "images_per_s": {k: round(v[2]) for k, v in best.items()},
        "load": round(os.getloadavg()[0], 1),
    }


if __name__ == "__main__":
    data, size, *rest = sys.argv[1:]
    rounds, stages = (rest + ["2", ""])[:2]
    print(json.dumps(main(data, int(size), int(rounds), stages)))
