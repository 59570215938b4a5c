"""One-example TFRecord files into 100-example files: convert against the plain rewrite (issue 42).

The asker's input: one ``tf.train.Example`` a ``.tfrecord`` file, label-sorted (the
files in name order hold label 0, then 1, ...; 10 labels, small JPEGs). Two
contenders on the same files, round-robin, each in its own process (wall time and
peak RSS of its process tree):
- plain: the rewrite a user writes instead (``_plain_rewrite.py``): tf.data over the
  files with ``interleave``, ``shuffle(10000)``, 100-example files written with
  ``tf.io.TFRecordWriter``; no check of the images, no split.
- convert: ``evenshard convert --input_format=tfrecord --splits=train=1.0`` into
  shards of 100 examples, the default runner and ``--verify`` (full decode).
The label mix of each output (``audit/mixing.py``: 1.0 is a random permutation) is
measured on the output read as written: files in name order, each front to back,
batch 256. Local at two file counts (memory flat in the number of files), and a
smaller count through the loopback GCS server (``evenshard.emulator``; output local).

    .venv/bin/python benchmarks/records_bench.py [--files 20000,100000] [--gcs_files 2000]
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BIN, HERE, WORK, bench_main, measured, table_rows, tiny, verdict  # noqa: E402

LABELS = 10
PER_FILE = 100  # examples an output file
BATCH = tiny(256, 8)
IMAGES = tiny(2_000, 16)  # distinct JPEGs, cycled over the records


def one_example_files(n: int) -> str:
    """``n`` one-example TFRecord files, label-sorted by name; cached."""
    import numpy as np

    from evenshard.synthetic import image_bytes
    from schemas import tfrecord
    from schemas.example import serialize_example

    root = os.path.join(WORK, f"records_{n}")
    if os.path.exists(os.path.join(root, ".done")):
        return root
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rng = np.random.default_rng(0)
    images = [image_bytes("jpeg", 64, 64, rng) for _ in range(IMAGES)]
    for i in range(n):
        record = serialize_example(
            {"image/encoded": images[i % IMAGES], "image/class/label": i * LABELS // n}
        )
        with open(os.path.join(root, f"train-{i:07d}.tfrecord"), "wb") as f:
            f.write(tfrecord.frame(record))
    open(os.path.join(root, ".done"), "w").close()
    return root


def label_mix(files: list[str]) -> float:
    """``label_mix_ratio`` of the records of ``files`` read in this order, front to back."""
    from audit.mixing import label_mix_ratio
    from schemas import tfrecord
    from schemas.example import parse_example

    labels = [
        parse_example(data)["image/class/label"] for f in files for data in tfrecord.iter_records(f)
    ]
    return round(label_mix_ratio(labels, BATCH), 3), len(labels)


def plain(pattern: str, out: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    m = measured([sys.executable, os.path.join(HERE, "_plain_rewrite.py"), pattern, out])
    m["label_mix"], m["examples"] = label_mix(sorted(glob.glob(os.path.join(out, "*.tfrecord"))))
    return m


def convert(src: str, out: str, n: int) -> dict:
    import schemas
    from schemas import layout

    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        os.path.join(BIN, "evenshard"),
        "convert",
        "--input_format=tfrecord",
        f"--input={src}",
        f"--output_dir={out}",
        "--splits=train=1.0",
        f"--num_shards={max(1, n // PER_FILE)}",
    ]
    m = measured(cmd)
    shards = schemas.load_info(out)["splits"]["train"]["shards"]
    files = [layout.join(out, sh["file"]) for sh in shards]
    m["label_mix"], m["examples"] = label_mix(files)
    return m


def _round_robin(contenders: dict, repeats: int) -> dict:
    """Each contender ``repeats`` times, alternating; every run's figures kept."""
    runs = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, run in contenders.items():
            runs[name].append(run())
    return runs


def _summary(runs: dict) -> dict:
    """Best and worst seconds, the largest peak RSS, the label mix of each contender, and
    convert's time over the plain rewrite's (best over best, and the range of the
    round-robin pairs)."""
    out = {}
    for name, ms in runs.items():
        out[name] = {
            "seconds": [m["seconds"] for m in ms],
            "cpu_seconds": [m["cpu_seconds"] for m in ms],
            "peak_rss_mb": max(m["peak_rss_mb"] for m in ms),
            "label_mix": ms[0]["label_mix"],
            "examples": ms[0]["examples"],
        }
    pairs = [c["seconds"] / p["seconds"] for c, p in zip(runs["convert"], runs["plain"])]
    out["ratio_best"] = round(min(out["convert"]["seconds"]) / min(out["plain"]["seconds"]), 2)
    out["ratio_range"] = [round(min(pairs), 2), round(max(pairs), 2)]
    return out


FLAGS = {
    "files": (str, "20000,100000", "comma list of local one-example file counts", "24"),
    "gcs_files": (int, 2_000, "one-example files read from the loopback GCS server", 16),
    "repeats": (int, 2, "runs of each contender, round-robin", 1),
}


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    result = {"local": {}, "per_file": PER_FILE, "load_average": [round(os.getloadavg()[0], 1)]}
    for n in (int(x) for x in a.files.split(",")):
        src = one_example_files(n)
        pattern = os.path.join(src, "*.tfrecord")
        runs = _round_robin(
            {
                "plain": lambda p=pattern: plain(p, os.path.join(WORK, "records_plain")),
                "convert": lambda s=src, n=n: convert(s, os.path.join(WORK, "records_out"), n),
            },
            a.repeats,
        )
        result["local"][n] = _summary(runs)
    from evenshard.emulator import gcs_emulator, upload

    n = a.gcs_files
    with gcs_emulator() as client:
        url = upload(client.create_bucket("bench"), one_example_files(n), "records")
        runs = _round_robin(
            {
                "plain": lambda: plain(url + "/*.tfrecord", os.path.join(WORK, "records_plain")),
                "convert": lambda: convert(url, os.path.join(WORK, "records_out"), n),
            },
            a.repeats,
        )
        result["gcs"] = {n: _summary(runs)}
    for folder in ("records_plain", "records_out"):
        shutil.rmtree(os.path.join(WORK, folder), ignore_errors=True)
    result["load_average"].append(round(os.getloadavg()[0], 1))
    return result


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""

    def cells(where):
        def row(n, s):
            c, p = s["convert"], s["plain"]
            return [
                where,
                f"{int(n):,}",
                f"{min(p['seconds']):.1f}–{max(p['seconds']):.1f}",
                f"{min(c['seconds']):.1f}–{max(c['seconds']):.1f}",
                f"**{s['ratio_best']:.2f}** ({s['ratio_range'][0]:.2f}–{s['ratio_range'][1]:.2f})",
                f"{min(p['cpu_seconds']):.0f}",
                f"{min(c['cpu_seconds']):.0f}",
                f"{p['peak_rss_mb']:,}",
                f"{c['peak_rss_mb']:,}",
                f"{p['label_mix']:.2f}",
                f"**{c['label_mix']:.2f}**",
            ]

        return row

    rows = "\n".join(
        [table_rows(r["local"].items(), cells("local")), table_rows(r["gcs"].items(), cells("GCS"))]
    )
    local = r["local"]
    (n1, a), (n2, b) = (
        sorted((int(n), v) for n, v in local.items())[:1]
        + sorted((int(n), v) for n, v in local.items())[-1:]
    )
    growth = (b["convert"]["peak_rss_mb"] - a["convert"]["peak_rss_mb"]) * 1e3 / max(1, n2 - n1)
    worst = max(s["ratio_best"] for s in (*local.values(), *r["gcs"].values()))
    mix = max(s["convert"]["label_mix"] for s in (*local.values(), *r["gcs"].values()))
    start_end = r.get("load_average")
    load = (
        f"{start_end[0]:.1f} at the start, {start_end[-1]:.1f} at the end"
        if start_end
        else "not recorded"
    )
    return f"""## one-example TFRecord files — `benchmarks/records_bench.py`

The asker of issue 42 holds one `tf.train.Example` a `.tfrecord` file and
wants {r["per_file"]} a file, mixed. Label-sorted one-example files (10 labels,
JPEGs of about 1.6 KB) rewritten into {r["per_file"]}-example files two ways, in
their own processes, round-robin: the plain rewrite a user writes (tf.data
`interleave`, `shuffle(10000)`, `tf.io.TFRecordWriter`; no image checked, no
split) and `evenshard convert --input_format=tfrecord --splits=train=1.0` with
shards of {r["per_file"]} (the default runner, every image decoded). Label mix of
each output read as written (files in order, front to back, batch 256; 1.0 is a
random permutation). GCS: the loopback server (`evenshard.emulator`, a Python
server on the same cores), the output local; the rewrite downloads 16 files at
once, convert's reader and writer 4 at a time. Load average (1 min) {load}: other
work shared the 2 cores, so compare the ratios, not the seconds.

| input | files | plain (s) | convert (s) | convert / plain: best (pairs) | plain CPU (s) | convert CPU (s) | plain peak RSS (MB) | convert peak RSS (MB) | plain label mix | convert label mix |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

Worst convert / plain: **{worst:.2f}** (aim ≤ 1.0 — {verdict(worst, 1.0)}); convert's
label mix at worst **{mix:.2f}** (aim ≤ 1.05 — {verdict(mix, 1.05)}). Convert's
peak RSS grows {growth:.2f} KB a file from {n1:,} to {n2:,} files.
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
