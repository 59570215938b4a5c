"""What `cache` and `prefetch` buy in `reader.make_dataset`, measured in one run.

- prefetch: a training loop whose step takes ``--step_ms`` (a sleep, as an accelerator's
  step leaves the host's cores free) reads the split with ``prefetch=None`` and with the
  default (AUTOTUNE). Without prefetch the host decodes batch s+1 only after step s ends;
  with it, during step s. Figure: steps a second, and the share of the ideal (one step's
  time a batch).
- cache: epochs 2 and 3 of the same split, read with ``cache=False`` and ``cache=True``,
  decoded (64×64) and as raw records (``decode=False``). ``cache`` holds this worker's
  serialized records in memory (read once, when the dataset is built), so it saves the
  file reads and nothing else: the decode still runs every epoch.

    .venv/bin/python benchmarks/cache_prefetch_bench.py [--images 8000 --step_ms 40]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, make_jpegs, tiny  # noqa: E402

SIZE = (64, 64)
BATCH = tiny(128, 8)

FLAGS = {
    "images": (int, 8_000, "JPEGs to generate and read", 32),
    "step_ms": (float, 40.0, "the simulated training step, in milliseconds", 1.0),
    "rounds": (int, 3, "passes of each contender, round-robin, best kept", 1),
}


def _count(batch) -> int:
    return int(batch["label"].shape[0])


def train_rate(ds, step_s: float, n: int) -> float:
    """Batches a second of a loop that sleeps ``step_s`` a batch (one epoch)."""
    start, seen, steps = time.perf_counter(), 0, 0
    for batch in ds:
        seen += _count(batch)
        steps += 1
        time.sleep(step_s)
    if seen != n:
        raise RuntimeError(f"read {seen} records, expected {n}")
    return steps / (time.perf_counter() - start)


def later_epochs_rate(ds, n: int, epochs: int) -> float:
    """Records a second after the first epoch's records of a read of ``epochs`` epochs
    (epoch 1 skipped: it fills the cache; batches run across epochs)."""
    it = iter(ds)
    seen = 0
    while seen < n:
        seen += _count(next(it))
    start, later = time.perf_counter(), 0
    for batch in it:
        later += _count(batch)
    if seen + later != n * epochs:
        raise RuntimeError(f"read {seen + later} records, expected {n * epochs}")
    return later / (time.perf_counter() - start)


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reader

    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    # --smoke: in 8 shards, train_bench's conversion of the same 32 JPEGs (shared)
    shards = tiny((), ("--num_shards=8",))
    data_dir = convert_once(
        src, os.path.join(WORK, f"cache_prefetch_{a.images}"), "--splits=train=1.0", *shards
    )
    n = reader.load_info(data_dir).split("train").num_examples
    step_s = a.step_ms / 1000

    def read(**options):
        return reader.make_dataset(data_dir, "train", BATCH, seed=0, **options)

    prefetch = {
        "prefetch_none": read(image_size=SIZE, prefetch=None),
        "prefetch_default": read(image_size=SIZE),
    }
    cache = {
        "decoded": (read(image_size=SIZE, epochs=3), read(image_size=SIZE, epochs=3, cache=True)),
        "raw_records": (read(decode=False, epochs=3), read(decode=False, epochs=3, cache=True)),
    }
    steps = dict.fromkeys(prefetch, 0.0)
    later = {k: [0.0, 0.0] for k in cache}
    for _ in range(a.rounds):
        for name, ds in prefetch.items():
            steps[name] = max(steps[name], train_rate(ds, step_s, n))
        for name, pair in cache.items():
            for i, ds in enumerate(pair):
                later[name][i] = max(later[name][i], later_epochs_rate(ds, n, 3))
    ideal = 1 / step_s
    return {
        "images": n,
        "batch": BATCH,
        "step_ms": a.step_ms,
        "steps_per_s": {k: round(v, 2) for k, v in steps.items()},
        "share_of_ideal": {k: round(v / ideal, 3) for k, v in steps.items()},
        "later_epochs_records_per_s": {
            k: {"cache_off": round(off), "cache_on": round(on), "on_over_off": round(on / off, 2)}
            for k, (off, on) in later.items()
        },
    }


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    s, share = r["steps_per_s"], r["share_of_ideal"]
    c = r["later_epochs_records_per_s"]
    return f"""## cache and prefetch — `benchmarks/cache_prefetch_bench.py`

{r["images"]:,} small JPEGs, one split, batches of {r["batch"]}, decoded to 64×64.

**prefetch**: a loop whose step takes {r["step_ms"]:g} ms (a sleep: an accelerator's step
leaves the host's cores free) over one epoch.

| `prefetch` | steps/s | of the ideal (one step's time a batch) |
|---|---:|---:|
| `None` | {s["prefetch_none"]:.2f} | {share["prefetch_none"]:.2f} |
| default (AUTOTUNE) | {s["prefetch_default"]:.2f} | {share["prefetch_default"]:.2f} |

**cache**: records/s over epochs 2 and 3 of a 3-epoch read (the shards in the page cache).

| read | cache off | cache on | on / off |
|---|---:|---:|---:|
| decoded 64×64 | {c["decoded"]["cache_off"]:,} | {c["decoded"]["cache_on"]:,} | {c["decoded"]["on_over_off"]:.2f} |
| raw records (`decode=False`) | {c["raw_records"]["cache_off"]:,} | {c["raw_records"]["cache_on"]:,} | {c["raw_records"]["on_over_off"]:.2f} |
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
