"""``explain``: the keys of each batch of some steps, at 1M records, without reading them.

A synthetic split of ``--records`` records in 1,024 shards (no files: the plan is made
from the counts, as every reader makes it; the keys are given, as explain holds them
once read), 8 workers, batches of 256, seed 0, the reader's defaults (cycle 16,
shuffle_buffer 1000). Timed, best of ``--rounds``, from nothing (the read resolved,
the epoch's order computed) and again warm (the next stretch of the same read): steps 1200:1210 of rank 3; 1000 steps (a long stretch); the same with
random crops and flips (the boxes: torchvision's draws, a Python loop an image); rank
3 after an elastic resume 8 -> 6 workers at step 300 (its lead: every old worker's
order of the epoch). Aim: under 1 ms a batch. Checked: a batch holds 256 distinct keys
of the rank's shards. Also the one-time cost explain pays on a real dataset: reading
the keys of a shard's records (``shard_keys``: two small reads a record, the image
jumped over), records/s, on ``--images`` converted JPEGs.

    .venv/bin/python benchmarks/explain_bench.py [--records 1000000] [--rounds 3]
"""

from __future__ import annotations

import os
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, make_jpegs  # noqa: E402

BATCH, WORKERS, RANK, SHARDS = 256, 8, 3, 1024
FLAGS = {
    "records": (int, 1_000_000, "records of the synthetic split", 65_536),
    "rounds": (int, 3, "timed rounds (best of)", 1),
    "images": (int, 2_000, "converted JPEGs whose keys are read", 64),
}


def _read(records: int, options, state=None):
    """The resolved read of rank ``RANK`` over a synthetic split (no files)."""
    from reader.front.read import Read, Source
    from reader.front.share import Share

    per = records // SHARDS
    folder = os.path.join(WORK, f"explain_index_{records}")
    if not os.path.exists(os.path.join(folder, ".done")):  # the DALI index a lead needs
        os.makedirs(folder, exist_ok=True)
        text = "".join(f"{r * 100} 100\n" for r in range(per))
        for f in range(SHARDS):
            with open(os.path.join(folder, f"s{f}.idx"), "w") as out:
                out.write(text)
        open(os.path.join(folder, ".done"), "w").close()
    shards = [
        {
            "path": f"s{f}",
            "num_examples": per,
            "num_bytes": per * 100,
            "index": os.path.join(folder, f"s{f}.idx"),
        }
        for f in range(SHARDS)
    ]
    share = Share.of("synthetic", "train", shards, BATCH, options, 0, state)
    info = types.SimpleNamespace(record_kind="image", key_feature=None)  # images' keys
    source = Source(info, "synthetic", "train", share)
    return Read((source,), None, 0, share.remaining, share.real_batches, None, 0, options, BATCH)


def _explainer(records: int, options, state=None):
    """An ``Explain`` of the synthetic read, its keys those of a table given once."""
    from reader.explain import Explain

    start = time.perf_counter()
    plan = Explain(_read(records, options, state), augment=options.augment())
    resolved = time.perf_counter() - start
    per = records // SHARDS
    sizes = np.full(per, 64, np.int64)
    for source in plan.keys:
        for table in (source.own, source.split):
            if table is not None:
                for f, shard in enumerate(table.shards):
                    name = int(shard["path"][1:])
                    table.fill(f, [f"{name:04d}/{r:06d}" for r in range(per)], sizes, sizes)
    return resolved, plan


def _timed(make, steps: range, rounds: int) -> dict:
    """ms a batch: a fresh explainer (timed from its making: the read resolved, an
    elastic lead computed), then a warm one."""
    cold = warm = float("inf")
    for _ in range(rounds):
        resolved, plan = make()  # its keys given untimed
        start = time.perf_counter()
        batches = [plan.batch(k) for k in steps]
        cold = min(cold, resolved + time.perf_counter() - start)
        shifted = range(steps.start + len(steps), steps.stop + len(steps))
        start = time.perf_counter()
        [plan.batch(k) for k in shifted]
        warm = min(warm, time.perf_counter() - start)
    for b in batches:
        assert len(set(b["key"])) == BATCH and all(b["mask"])
    return {"cold_ms": 1e3 * cold / len(steps), "warm_ms": 1e3 * warm / len(steps)}


def measure(a) -> dict:
    from reader.front.shard_keys import shard_keys
    from reader.values.read_options import ReadOptions
    from reader.values.split_shards import load_index, split_shards
    from reader.values.state import ReadState
    from schemas.dataset_info import load_dataset_info

    plain = ReadOptions(seed=0, epochs=None, num_workers=WORKERS, worker_index=RANK)
    crops = ReadOptions(
        seed=0,
        epochs=None,
        num_workers=WORKERS,
        worker_index=RANK,
        random_crop=True,
        random_flip=True,
    )
    resized = ReadOptions(seed=0, epochs=None, num_workers=6, worker_index=RANK)
    saved = ReadState(0, BATCH, step=300, num_workers=WORKERS)
    short, long = range(1200, 1210), range(0, 1000)  # an endless read: any step
    cases = {
        "steps 1200:1210": _timed(lambda: _explainer(a.records, plain), short, a.rounds),
        f"{len(long)} steps": _timed(lambda: _explainer(a.records, plain), long, a.rounds),
        "steps 1200:1210, crops and flips": _timed(
            lambda: _explainer(a.records, crops), short, a.rounds
        ),
        "steps 0:10 after 8 -> 6 workers at step 300": _timed(
            lambda: _explainer(a.records, resized, saved), range(0, 10), a.rounds
        ),
    }
    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    data = convert_once(
        src, os.path.join(WORK, f"explain_{a.images}"), "--splits=train=1.0", "--num_shards=4"
    )
    shards = [
        {**s, "table": load_index(s)} for s in split_shards(load_dataset_info(data), data, "train")
    ]
    best = float("inf")
    for _ in range(a.rounds):
        start = time.perf_counter()
        n = sum(len(shard_keys(s)[0]) for s in shards)
        best = min(best, time.perf_counter() - start)
    return {
        "records": a.records,
        "shards": SHARDS,
        "workers": WORKERS,
        "batch": BATCH,
        "ms_a_batch": {k: {m: round(v, 3) for m, v in c.items()} for k, c in cases.items()},
        "keys_read_records_per_s": round(n / best),
        "keys_read_images": n,
    }


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    rows = "\n".join(
        f"| {k} | {c['cold_ms']:.3f} | {c['warm_ms']:.3f} |" for k, c in r["ms_a_batch"].items()
    )
    return f"""## explain — `benchmarks/explain_bench.py`

The keys of each batch of some steps of rank 3 of {r["workers"]}, batches of {r["batch"]},
over a synthetic split of {r["records"]:,} records in {r["shards"]:,} shards (the plan from
the counts, the keys given: what explain holds once it has read them). Cold: from nothing (the read
resolved, a resized read's lead computed, the epoch's order, the batches; the keys
given); warm: the next stretch of the same read. Aim: under 1 ms a batch.

| steps | cold ms a batch | warm ms a batch |
|---|---:|---:|
{rows}

Reading the keys once (the image of each record jumped over, two small reads a record):
{r["keys_read_records_per_s"]:,} records/s ({r["keys_read_images"]:,} converted JPEGs).
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
