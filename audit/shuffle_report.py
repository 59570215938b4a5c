"""How well does reading a split mix it? (``evenshard shuffle-report``)

Reads the split through ``reader.make_dataset`` (labels and keys only, no
image decode) for two epochs and prints three metrics (see audit/mixing.py):
label mix per batch as a ratio to random permutations, order memory
(Spearman against the source key order) and neighbour repeats between
epochs. Writes a PNG in the spirit of the classic diagnostic plot: read
position against label, and against source index. ``--baseline`` adds the
same for a plain tf.data ``shuffle(buffer)`` over one unshuffled TFRecord
file of the same examples in source order, side by side.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from audit import mixing
from schemas import features, layout, storage, tfrecord
from schemas.errors import InvalidValueError


def _read_order(ds) -> tuple[list[bytes], list[int]]:
    keys, labels = [], []
    for batch in ds:
        keys += list(np.atleast_1d(batch["key"].numpy()))
        labels += list(np.atleast_1d(batch["label"].numpy()))
    return keys, labels


def measure(
    keys: list[bytes], labels: list[int], n: int, batch_size: int, source_rank: dict[bytes, int]
) -> dict:
    """Metrics of a read order of ``epochs * n`` keys (epoch e is keys[e*n:(e+1)*n])."""
    first = keys[:n]
    out = {
        "label_mix_ratio": mixing.label_mix_ratio(np.array(labels[:n]), batch_size),
        "order_memory": mixing.order_memory([source_rank[k] for k in first]),
    }
    if len(keys) >= 2 * n:
        repeats = mixing.neighbour_repeats(first, keys[n : 2 * n])
        out["neighbour_repeats"] = repeats
        out["neighbour_repeats_vs_independent"] = repeats / mixing.independent_neighbour_repeats(n)
    return out


def _baseline(data_dir: str, split: str, buffer: int, seed: int, epochs: int, batch_size: int):
    """tf.data shuffle(buffer) over one TFRecord file of the split in source (key) order."""
    tf = storage.tensorflow()

    import reader

    info = reader.load_info(data_dir)
    records = []
    for shard in info.split(split).shards:
        records += list(tfrecord.iter_records(layout.join(data_dir, shard.file)))
    spec = {
        features.KEY: tf.io.FixedLenFeature([], tf.string),
        features.LABEL: tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf.io.parse_example(tf.constant(records), spec)
    order = np.argsort(parsed[features.KEY].numpy(), kind="stable")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "source_order.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in order:
                w.write(records[i])
        ds = (
            tf.data.TFRecordDataset(path)
            .shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
            .repeat(epochs)
            .batch(batch_size)
            .map(lambda r: tf.io.parse_example(r, spec))
            .map(lambda ex: {"key": ex[features.KEY], "label": ex[features.LABEL]})
        )
        return _read_order(ds)


MAX_LABEL_TICKS = 30

METRICS_LEGEND = (
    "label mix: batch label spread vs a random permutation (1 = random, lower = more even, "
    "above 1 = batches lean to few labels); "
    "order mem: Spearman vs source order (0 = none, good; near 1 = the source order shows "
    "through); "
    "repeats: neighbours adjacent again next epoch, as a multiple of an independent shuffle "
    "(1x = as fresh as a new permutation, good; higher = batches meet the same neighbours "
    "again)"
)


def _metrics_text(m: dict) -> str:
    text = f"label mix {m['label_mix_ratio']:.2f}, order memory {m['order_memory']:.2f}"
    if "neighbour_repeats_vs_independent" in m:
        text += f", repeats {m['neighbour_repeats_vs_independent']:.2f}x"
    return text


def plot(panels: list[tuple], out: str, labels: list[str]) -> None:
    """panels: (title, metrics, labels in read order, source index in read order, examples
    an epoch), one column each, every epoch read; the label axis names the labels (up to
    30), each title carries its metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(panels), figsize=(6 * len(panels), 7.5), squeeze=False)
    for col, (title, metrics, read_labels, source, per_epoch) in enumerate(panels):
        x = np.arange(len(read_labels))
        for ax in axes[:, col]:  # every epoch read is plotted: mark where each starts
            for start in range(per_epoch, len(x), per_epoch):
                ax.axvline(start, color="grey", linewidth=0.8, linestyle="--")
        size = float(np.clip(3000 / max(len(x), 1), 0.3, 12))  # visible on small splits too
        top = axes[0, col]
        top.scatter(x, read_labels, s=size, alpha=0.5)
        epochs = -(-len(x) // max(per_epoch, 1))
        xlabel = f"read position ({epochs} epochs, dashed lines between them)"
        top.set(xlabel=xlabel, ylabel="label", ylim=(-0.5, len(labels) - 0.5))
        top.set_title(f"{title}\n{_metrics_text(metrics)}", fontsize=10)
        if len(labels) <= MAX_LABEL_TICKS:
            top.set_yticks(range(len(labels)), labels, fontsize=7)
        axes[1, col].scatter(x, source, s=size, alpha=0.5)
        axes[1, col].set(xlabel=xlabel, ylabel="source index (key order)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def report(
    data_dir: str,
    split: str = "train",
    out: str = "shuffle_report.png",
    baseline: bool = False,
    baseline_buffer: int | None = None,
    epochs: int = 2,
    batch_size: int = 256,
    **reader_options,
) -> dict:
    """Measures the split's read order (and the baseline's); writes the PNG; returns figures.

    ``baseline_buffer`` defaults to a tenth of the split (at most 10,000), so
    the contrast with a buffer that cannot hold the split shows on small
    splits too.
    """
    import os

    import reader

    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise InvalidValueError(f"--out {out}: folder {folder} does not exist; create it first")
    info = reader.load_info(data_dir)
    if split not in info.split_names:
        raise reader.DatasetError(
            f"split {split!r} not in {data_dir}; it has {', '.join(info.split_names)}"
        )
    n = info.split(split).num_examples
    if n < batch_size:
        raise InvalidValueError(
            f"split {split} has {n} examples, fewer than one batch of {batch_size}: "
            f"pass --batch_size {max(n // 4, 1)} or less"
        )
    reader_options.setdefault("seed", 0)
    ds = reader.make_dataset(
        data_dir, split, batch_size=batch_size, decode=False, epochs=epochs, **reader_options
    )
    keys, labels = _read_order(ds)
    source_rank = {k: i for i, k in enumerate(sorted(set(keys)))}
    results = {"evenshard reader": measure(keys, labels, n, batch_size, source_rank)}
    panels = [("evenshard reader", labels, [source_rank[k] for k in keys], n)]
    if baseline_buffer is None:
        baseline_buffer = min(10_000, max(1, n // 10))
    if baseline:
        b_keys, b_labels = _baseline(
            data_dir, split, baseline_buffer, reader_options["seed"], epochs, batch_size
        )
        name = f"tf.data shuffle({baseline_buffer}) of one sorted file"
        results[name] = measure(b_keys, b_labels, n, batch_size, source_rank)
        panels.append((name, b_labels, [source_rank[k] for k in b_keys], n))
    plot([(name, results[name], *rest) for name, *rest in panels], out, list(info.labels))
    return {
        "split": split,
        "order": _order_of(info, data_dir, split, reader_options),
        "num_examples": n,
        "batch_size": batch_size,
        "epochs": epochs,
        "reader_options": reader_options,
        "png": out,
        "baseline_buffer": baseline_buffer if baseline else None,
        "results": results,
    }


def _order_of(info, data_dir: str, split: str, reader_options: dict) -> str:
    """The order the reader read, in words: what the figures measure."""
    from reader.front.share import random_access
    from reader.values.split_shards import split_shards

    if reader_options.get("shuffle") is False:
        return "the stored order (shuffle=False)"
    shards = split_shards(info, data_dir, split)
    if random_access(shards, reader_options.get("random_access")):
        return "one permutation of the records an epoch, each fetched by its place"
    return "runs of shards interleaved, then a shuffle window (a bucket, gzip, --no_random_access)"


def render(r: dict) -> str:
    lines = [
        f"{r['split']}: {r['num_examples']:,} examples, batch {r['batch_size']}, "
        f"{r['epochs']} epochs, reader options {json.dumps(r['reader_options'])}",
        f"  order: {r['order']}",
        f"  {'pipeline':<44}{'label mix':>10}{'order mem':>11}{'repeats (x indep.)':>20}",
    ]
    for name, m in r["results"].items():
        rep = (
            f"{m['neighbour_repeats']:.5f} ({m['neighbour_repeats_vs_independent']:.2f}x)"
            if "neighbour_repeats" in m
            else "-"
        )
        lines.append(
            f"  {name:<44}{m['label_mix_ratio']:>10.3f}{m['order_memory']:>11.3f}{rep:>20}"
        )
    lines.append(f"  ({METRICS_LEGEND})")
    lines.append(f"  plot: {r['png']}")
    return "\n".join(lines)
