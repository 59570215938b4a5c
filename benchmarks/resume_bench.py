"""Resuming a read mid-epoch (issue 13), and what the computable order costs in mixing.

On 20,000 JPEGs in 16 shards (decode + resize to 64x64, batch 256, seed 0):
- resume: time to the first batch of ``make_dataset(..., start_step=k)``,
  for k at 10%, 50% and 90% of an epoch, against replaying the epoch to k
  (reading batches 0..k of the same pipeline), measured round-robin, best
  of 5. Aims: resume time flat in k; what resuming adds to a fresh start
  (k=0) at most the time to read one shard's raw records.
- state size: ``ReadState`` as JSON against a ``tf.train.Checkpoint`` of a
  tf.data iterator with the old pipeline's ``shuffle(1000)`` (what tf.data
  users save to resume).
- mixing: audit/mixing.py metrics of the reader against the pipeline it
  replaced (per-epoch file shuffle -> interleave of 16 files ->
  ``shuffle(1000)``), rebuilt here in tf.data, same data, same run: on the
  16-shard split and on a one-shard split (the default conversion of the same
  images). Aim: within 5% of the old pipeline (or better).

    .venv/bin/python benchmarks/resume_bench.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import SMOKE, WORK, bench_main, convert_once, make_jpegs, tiny, verdict  # noqa: E402

BATCH = tiny(256, 4)
SIZE = (64, 64)
EPOCHS = tiny(6, 2)  # mixing: 5 pairs of consecutive epochs
IMAGES = tiny(20_000, 64)


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import reader
    from schemas import layout

    src = make_jpegs(os.path.join(WORK, f"jpegs_{IMAGES}"), IMAGES)
    sixteen = convert_once(
        src, os.path.join(WORK, f"read_{IMAGES}"), "--splits=train=1.0", "--num_shards=16"
    )
    one = convert_once(src, os.path.join(WORK, f"shuffle_default_{IMAGES}"))
    info = reader.load_info(sixteen)
    n = info.split("train").num_examples
    files = [layout.join(sixteen, s.file) for s in info.split("train").shards]
    per_epoch = n // BATCH
    steps = {f"{p}%": per_epoch * p // 100 for p in (10, 50, 90)}

    def open_at(k):
        return reader.make_dataset(
            sixteen, "train", BATCH, image_size=SIZE, seed=0, epochs=None, start_step=k
        )

    def first_batch(k) -> float:
        start = time.perf_counter()
        next(iter(open_at(k)))
        return time.perf_counter() - start

    def replay(k) -> float:
        start = time.perf_counter()
        for _ in open_at(0).take(k + 1):
            pass
        return time.perf_counter() - start

    def one_shard_raw() -> float:
        start = time.perf_counter()
        for _ in tf.data.TFRecordDataset(files[0]).batch(BATCH):
            pass
        return time.perf_counter() - start

    if not SMOKE:  # --smoke times nothing: fresh_k0 below runs the same first batch
        first_batch(0)  # warm up: imports, graph tracing, file cache
    best: dict[str, float] = {}
    for _ in range(tiny(5, 1)):
        for name, fn in [("fresh_k0", lambda: first_batch(0)), ("one_shard_raw", one_shard_raw)]:
            best[name] = min(best.get(name, 1e9), fn())
        for label, k in steps.items():
            for kind, fn in (("resume", first_batch), ("replay", replay)):
                key = f"{kind}_{label}"
                best[key] = min(best.get(key, 1e9), fn(k))

    state = reader.ReadState(seed=0, batch_size=BATCH, step=steps["50%"], num_workers=1)
    result = {
        "images": n,
        "batch_size": BATCH,
        "steps": steps,
        "seconds": {k: round(v, 4) for k, v in best.items()},
        "replay_over_resume": {
            label: round(best[f"replay_{label}"] / best[f"resume_{label}"], 1) for label in steps
        },
        "resume_extra_over_one_shard_raw": {
            label: round(
                max(best[f"resume_{label}"] - best["fresh_k0"], 0) / best["one_shard_raw"], 2
            )
            for label in steps
        },
        "state_bytes": len(state.to_json()),
        "tf_checkpoint_bytes": _tf_checkpoint_bytes(tf, files, steps["50%"]),
        "mixing": {
            "16_shards": _mixing(tf, reader, sixteen),
            "1_shard": _mixing(tf, reader, one),
        },
    }
    return result


def _old_pipeline(tf, files, seed=0):
    """The reader this one replaced: file shuffle per epoch, interleave of 16, shuffle(1000)."""
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(16, len(files)))
    return ds.shuffle(1000, seed=seed)


def _tf_checkpoint_bytes(tf, files, k) -> int:
    it = iter(_old_pipeline(tf, files).repeat().batch(BATCH))
    for _ in range(k):
        next(it)
    with tempfile.TemporaryDirectory() as tmp:
        tf.train.Checkpoint(iterator=it).save(os.path.join(tmp, "ckpt"))
        return sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))


def _mixing(tf, reader, data_dir) -> dict:
    from schemas import features, layout

    info = reader.load_info(data_dir)
    n = info.split("train").num_examples
    files = [layout.join(data_dir, s.file) for s in info.split("train").shards]
    spec = {
        features.KEY: tf.io.FixedLenFeature([], tf.string),
        features.LABEL: tf.io.FixedLenFeature([], tf.int64),
    }

    def order(ds):
        keys, labels = [], []
        for batch in ds.batch(BATCH).map(lambda r: tf.io.parse_example(r, spec)):
            keys += list(batch[features.KEY].numpy())
            labels += list(batch[features.LABEL].numpy())
        return keys, labels

    ours = reader.make_dataset(data_dir, "train", BATCH, decode=False, seed=0, epochs=EPOCHS)
    keys, labels = [], []
    for batch in ours:
        keys += list(batch["key"].numpy())
        labels += list(batch["label"].numpy())
    rank = {k: i for i, k in enumerate(sorted(set(keys)))}
    old_keys, old_labels = order(_old_pipeline(tf, files).repeat(EPOCHS))
    return {
        "shards": len(files),
        "reader": _measure(keys, labels, n, rank),
        "old_pipeline": _measure(old_keys, old_labels, n, rank),
    }


def _measure(keys, labels, n, rank) -> dict:
    """shuffle-report's metrics of the first two epochs, and neighbour repeats averaged
    over every pair of consecutive epochs (a few pairs repeat by chance: more epochs,
    steadier figure)."""
    from audit import mixing
    from audit.shuffle_report import measure

    out = measure(keys, labels, n, BATCH, rank)
    repeats = [
        mixing.neighbour_repeats(keys[e * n : (e + 1) * n], keys[(e + 1) * n : (e + 2) * n])
        for e in range(EPOCHS - 1)
    ]
    out["mean_repeats_vs_independent"] = (
        sum(repeats) / len(repeats) / mixing.independent_neighbour_repeats(n)
    )
    return out


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    sec = r["seconds"]
    rows = "\n".join(
        f"| {label} (step {k}) | {sec[f'resume_{label}']:.3f} | {sec[f'replay_{label}']:.3f} | "
        f"{r['replay_over_resume'][label]:.1f} | "
        f"{r['resume_extra_over_one_shard_raw'][label]:.2f} |"
        for label, k in r["steps"].items()
    )
    resumes = [sec[f"resume_{label}"] for label in r["steps"]]
    mix_rows = []
    for m in r["mixing"].values():
        for pipe, title in (("reader", "evenshard reader"), ("old_pipeline", "old pipeline")):
            x = m[pipe]
            mix_rows.append(
                f"| {m['shards']} | {title} | {x['label_mix_ratio']:.3f} | "
                f"{x['order_memory']:.3f} | {x['neighbour_repeats_vs_independent']:.2f}× | "
                f"{x['mean_repeats_vs_independent']:.2f}× |"
            )
    mix_table = "\n".join(mix_rows)
    worst_mix = max(
        m["reader"]["label_mix_ratio"] / m["old_pipeline"]["label_mix_ratio"]
        for m in r["mixing"].values()
    )
    worst_rep = max(
        m["reader"]["mean_repeats_vs_independent"]
        / m["old_pipeline"]["mean_repeats_vs_independent"]
        for m in r["mixing"].values()
    )
    extra = max(r["resume_extra_over_one_shard_raw"].values())
    spread = 1 / (r["images"] - 1) ** 0.5  # Spearman's deviation for independent orders
    return f"""## resume — `benchmarks/resume_bench.py`

{r["images"]:,} JPEGs in 16 shards, decode + resize to 64×64, batch {r["batch_size"]}, seed 0.
Resume: seconds to the first batch of `make_dataset(..., start_step=k)` (the
dataset built, the window in flight re-read and the first batch decoded).
Replay: reading batches 0..k of the same pipeline, what resuming costs
without a computable order. Best of 5, round-robin. A fresh start (k = 0)
took {sec["fresh_k0"]:.3f} s; reading one shard's raw records took {sec["one_shard_raw"]:.3f} s.

| k (of an epoch) | resume (s) | replay (s) | replay / resume | (resume − fresh start) / one shard's raw read |
|---|---:|---:|---:|---:|
{rows}

Resume time across k: {min(resumes):.3f}–{max(resumes):.3f} s (aim: flat in k —
{verdict(max(resumes) / min(resumes), 1.5)}, max/min ≤ 1.5). What resuming adds to a fresh
start is the window in flight re-read as raw records (at most
`shuffle_buffer` records) and header hops inside the runs of the group in
flight: at most about one shard's raw read (aim: ≤ 1.0 — {verdict(extra, 1.0)}).

The state a trainer saves: `ReadState.to_json()` is **{r["state_bytes"]} bytes**; a
`tf.train.Checkpoint` of a tf.data iterator of the old pipeline
(`shuffle(1000)` over these 2 KB records) is **{r["tf_checkpoint_bytes"]:,} bytes**, and
grows with image and buffer size.

Mixing, against the pipeline the computable order replaced (per-epoch file
shuffle → interleave of 16 files → `shuffle(1000)`, rebuilt in tf.data in the
same run, same seed, same files), read for 6 epochs; the one-shard split is
the default conversion of the same images. Repeats (x an independent shuffle
per epoch): epochs 1→2 as shuffle-report prints them, and the mean over the 5
pairs of consecutive epochs (a handful of pairs repeat by chance: the mean is
steadier).

| shards | pipeline | label mix | order memory | repeats 1→2 | repeats, mean of 5 |
|---:|---|---:|---:|---:|---:|
{mix_table}

| target | measured | aim |
|---|---:|---:|
| label mix, reader / old pipeline (worst split) | {worst_mix:.3f} | ≤ 1.05 — {verdict(worst_mix, 1.05)} |
| mean repeats, reader / old pipeline (worst split) | {worst_rep:.2f} | ≤ 1.05 — {verdict(worst_rep, 1.05)} |

Order memory is Spearman's correlation with the source key order: for
independent orders of {r["images"]:,} it is 0 ± {spread:.3f} (one standard deviation).
"""


if __name__ == "__main__":
    bench_main(measure, {}, __doc__)
