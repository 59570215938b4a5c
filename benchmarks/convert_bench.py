"""convert speed against the work it cannot avoid, measured in one run on the same files.

(a) naive: a sequential loop, read bytes -> tf.train.Example -> TFRecordWriter
    (no validation, no shuffle, no split).
(b) decode: a Pillow full-decode pass over every file with 2 processes (the
    work that validation cannot avoid).
(c) evenshard convert, DirectRunner, 2 worker processes, --verify full.
(d) the same with --verify header (Pillow open and size only).
Targets: c <= 1.5 x (a + b) in seconds; d <= 3 x a. Also reported: the
marginal cost of c per example (from a second run at 5k images), which
removes the fixed start-up of a Beam job. Plus peak RSS of the convert process
tree at 5k and 20k images (growth must come from metadata only, at most 2 KB
an example), and at 20k images four times larger (growth must not follow
image size).

Photos, imports included (``--photos``, 0 to skip): the peers bench's real-photo
JPEGs (about 22 KB), each contender a process of its own as a user runs it, wall and
CPU seconds (user + system of the process tree), round-robin: the plain loop
(``_plain_loop.py``), the same with Pillow's full decode of each image, and
``evenshard convert`` with its defaults; with ``--baseline REF``, convert as of that
git commit too (its tree exported to a folder), for a before/after in one sitting.
``--smoke`` runs 6 photos, each contender in this process (its code checked, not timed).

    .venv/bin/python benchmarks/convert_bench.py [--images 20000] [--photos 4000]
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    BIN,
    HERE,
    SMOKE,
    WORK,
    bench_main,
    git_tree,
    list_images,
    make_jpegs,
    run_here,
    run_measured,
    runs_here,
    tiny,
    verdict,
)


def naive_loop(files: list[tuple[str, str]], out: str) -> None:
    import tensorflow as tf

    labels = {label: i for i, label in enumerate(sorted({lb for _, lb in files}))}
    with tf.io.TFRecordWriter(out) as w:
        for path, label in files:
            with open(path, "rb") as f:
                data = f.read()
            feature = {
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[labels[label]])
                ),
            }
            ex = tf.train.Example(features=tf.train.Features(feature=feature))
            w.write(ex.SerializeToString())


def _decode(path: str) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return im.size


def decode_pass(files: list[tuple[str, str]]) -> None:
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        for _ in pool.imap_unordered(_decode, [p for p, _ in files], chunksize=256):
            pass


def convert_cmd(src: str, out: str, verify: str, workers: int = 2) -> list[str]:
    cmd = [
        os.path.join(BIN, "evenshard"),
        "convert",
        f"--input={src}",
        f"--output_dir={out}",
        f"--verify={verify}",
        "--overwrite",
        "--num_shards=8",
    ]
    if workers > 1:
        cmd += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    else:  # explicitly: from MULTI_PROCESSING_FROM inputs the default takes every core
        cmd += ["--direct_num_workers=1", "--direct_running_mode=in_memory"]
    return cmd


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def process_seconds(cmd: list[str], cwd: str | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of a command run to its end: user + system of it and its
    children, as ``time`` counts them. Under ``--smoke`` a command of this checkout
    runs here (``run_here``: its code and exit code checked, its figures meaningless)."""
    if runs_here(cmd, cwd):
        start, cpu = time.perf_counter(), time.process_time()
        run_here(cmd)
        return time.perf_counter() - start, time.process_time() - cpu
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


_CLI = "import sys; sys.argv[0] = 'evenshard'; from evenshard.cli import run; run()"


def photos_part(count: int, rounds: int, baseline: str) -> dict:
    """The photos, imports included: the plain loop, with Pillow's decode, convert
    (and convert at ``baseline``); best wall and best CPU of ``rounds`` round-robin."""
    from _peers_corpus import make_corpus

    src = make_corpus(count)
    loop = [sys.executable, os.path.join(os.path.dirname(__file__), "_plain_loop.py"), src]
    convert = ["convert", f"--input={src}", "--overwrite"]
    # under --smoke it runs here as the evenshard command (run() ends its process)
    mine = [os.path.join(BIN, "evenshard")] if SMOKE else [sys.executable, "-c", _CLI]
    contenders = {
        "plain": (loop + [os.path.join(WORK, "plain.tfrecord")], None),
        "plain_decode": (loop + [os.path.join(WORK, "plain.tfrecord"), "--verify"], None),
        "convert": ([*mine, *convert, f"--output_dir={WORK}/p_new"], os.path.dirname(HERE)),
    }
    if baseline:
        tree = git_tree(baseline, os.path.join(WORK, "baseline_tree"))
        cmd = [sys.executable, "-c", _CLI, *convert, f"--output_dir={WORK}/p_old"]
        contenders["convert_baseline"] = (cmd, tree)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, (cmd, cwd) in contenders.items():
            runs[name].append(process_seconds(cmd, cwd))
        loads.append(os.getloadavg()[0])
    return {
        "photos": count,
        "rounds": rounds,
        "baseline": baseline,
        "load_1min": [round(x, 1) for x in loads],
        "runs": {k: [[round(w, 2), round(c, 2)] for w, c in v] for k, v in runs.items()},
        "best_wall": {k: min(w for w, _ in v) for k, v in runs.items()},
        "best_cpu": {k: min(c for _, c in v) for k, v in runs.items()},
    }


FLAGS = {
    "images": (int, 20_000, "JPEGs to generate and convert", 24),
    "small": (int, 5_000, "size of the RSS comparison run", 12),
    "photos": (int, 4_000, "real photos for the imports-included part (0: skip it)", 6),
    "photo_rounds": (int, 3, "round-robin rounds of the photos part", 1),
    "baseline": (str, "", "a git commit whose convert the photos part runs too", ""),
    "skip_synthetic": (int, 0, "1: the photos part only (a before/after sitting)", 0),
}


def measure(a) -> dict:
    os.makedirs(WORK, exist_ok=True)
    photos = photos_part(a.photos, a.photo_rounds, a.baseline) if a.photos else None
    if a.skip_synthetic:
        return {"photos_part": photos}
    src = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}"), a.images)
    small = make_jpegs(os.path.join(WORK, f"jpegs_{a.small}"), a.small)
    big_images = make_jpegs(os.path.join(WORK, f"jpegs_{a.images}_256px"), a.images, size=256)
    files = list_images(src)
    n = len(files)
    import tensorflow  # noqa: F401 - imported before timing: (a) measures the loop, not the import

    def size_of(root):
        return sum(os.path.getsize(f) for f, _ in list_images(root)) / len(list_images(root))

    # Best of two, measured round-robin: a slow spell of this noisy machine
    # should not land on one contender only.
    runs: dict[str, list[float]] = {k: [] for k in ("a", "b", "c", "d", "c_small")}
    loads = [round(os.getloadavg()[0], 1)]
    rss_c = 0
    for _ in range(tiny(2, 1)):
        runs["a"].append(timed(naive_loop, files, os.path.join(WORK, "naive.tfrecord")))
        runs["b"].append(timed(decode_pass, files))
        seconds, rss = run_measured(convert_cmd(src, os.path.join(WORK, "conv_full"), "full"))
        runs["c"].append(seconds)
        rss_c = max(rss_c, rss)
        runs["d"].append(
            run_measured(convert_cmd(src, os.path.join(WORK, "conv_header"), "header"))[0]
        )
        # under --smoke the same 2-worker convert as (c) at another size proves nothing
        # more: its figure is (c)'s, and the process start-up (most of a smoke) is spared
        runs["c_small"].append(
            runs["c"][-1]
            if SMOKE
            else run_measured(convert_cmd(small, os.path.join(WORK, "conv_small"), "full"))[0]
        )
    t_a, t_b, t_c, t_d, t_c_small = (min(runs[k]) for k in ("a", "b", "c", "d", "c_small"))
    loads = [loads[0], round(os.getloadavg()[0], 1)]
    # Peak RSS, in-memory DirectRunner (all workers in one process): small vs full
    # input, and the full count of 4x larger images (growth must not follow image size).
    # Under --smoke one in-memory run (the 256 px folder) stands for all three: the
    # same command on another folder, whose figures mean nothing at a tiny size.
    rss = {}
    sizes = (("small", small), ("big", src), ("big_256px", big_images))
    for name, root in sizes[2:] if SMOKE else sizes:
        _, rss[name] = run_measured(convert_cmd(root, os.path.join(WORK, "rss"), "header", 1))
        shutil.rmtree(os.path.join(WORK, "rss"), ignore_errors=True)
    if SMOKE:
        rss["small"] = rss["big"] = rss["big_256px"]
    marginal = (t_c - t_c_small) / (n - a.small)
    result = {
        "images": n,
        "mean_image_bytes": round(size_of(src)),
        "seconds": {
            "a_naive": t_a,
            "b_decode": t_b,
            "c_convert_full": t_c,
            "d_convert_header": t_d,
            f"c_convert_full_{a.small}": t_c_small,
        },
        "examples_per_s": {k: n / v for k, v in {"a": t_a, "b": t_b, "c": t_c, "d": t_d}.items()},
        "c_over_a_plus_b": t_c / (t_a + t_b),
        "d_over_a": t_d / t_a,
        "c_marginal_per_example_over_a_plus_b": marginal / ((t_a + t_b) / n),
        "c_fixed_startup_s": t_c - marginal * n,
        "peak_rss_mb": {
            "convert_2_workers": rss_c / 1e6,
            f"in_memory_{a.small}": rss["small"] / 1e6,
            f"in_memory_{n}": rss["big"] / 1e6,
            f"in_memory_{n}_256px": rss["big_256px"] / 1e6,
        },
        "mean_image_bytes_256px": round(size_of(big_images)),
        "rss_growth_bytes_per_example": (rss["big"] - rss["small"]) / (n - a.small),
        "rss_256px_minus_64px_bytes_per_example": (rss["big_256px"] - rss["big"]) / n,
        "load_1min": loads,
        "photos_part": photos,
    }
    return result


def render_photos(part: dict) -> str:
    """The photos part's table: wall and CPU seconds of each contender, imports included."""
    names = {
        "plain": "plain loop: read → tf.train.Example → TFRecordWriter",
        "plain_decode": "the same, each image decoded by Pillow first (`open` + `load`)",
        "convert": "`evenshard convert`, its defaults (`--verify full`)",
        "convert_baseline": f"`evenshard convert` as of {part['baseline']}",
    }
    plain_wall, plain_cpu = part["best_wall"]["plain"], part["best_cpu"]["plain"]
    rows = "\n".join(
        f"| {names[k]} | {' / '.join(f'{w:.1f}' for w, _ in v)} | {part['best_wall'][k]:.1f} "
        f"| {part['best_cpu'][k]:.1f} | {part['best_wall'][k] / plain_wall:.2f} "
        f"| {part['best_cpu'][k] / plain_cpu:.2f} |"
        for k, v in part["runs"].items()
    )
    return f"""{part["photos"]:,} real photos (the peers bench's crops, about 22 KB each), each
contender a process of its own, imports included, {part["rounds"]} rounds round-robin; the
1-minute load average at the start and after each round: {part["load_1min"]} (2 cores).

| contender | wall s, each round | best wall s | best CPU s | wall / plain | CPU / plain |
|---|---|---:|---:|---:|---:|
{rows}

CPU seconds are user + system of the process tree; on a loaded machine they move
less than the wall. Where convert's time goes against the plain loop, the cost model
behind these ratios (the loop's fixed cost is TensorFlow's import, convert's a photo
is 12 times the loop's, half of it the check), and a sitting at 20,000 photos:
docs/convert.md, "convert against the plain TFRecordWriter loop".
"""


def render(c: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    cs, eps, rss = c["seconds"], c["examples_per_s"], c["peak_rss_mb"]
    small = next(k for k in cs if k.startswith("c_convert_full_"))
    load = (
        f" The 1-minute load average on the 2 cores before and after: {c['load_1min']}."
        if c.get("load_1min")
        else ""
    )
    photos = (
        "\n### Real photos, imports included\n\n" + render_photos(c["photos_part"])
        if c.get("photos_part")
        else ""
    )
    rss_rows = "\n".join(f"| {k.replace('_', ' ')} | {v:,.0f} MB |" for k, v in rss.items())
    return f"""## convert — `benchmarks/convert_bench.py`

{c["images"]:,} JPEGs of 64×64 (mean {c["mean_image_bytes"]:,} bytes), 10 labels. Times are
the best of two runs each, measured round-robin.{load}

| | what | seconds | examples/s |
|---|---|---:|---:|
| a | naive loop: read → tf.train.Example → TFRecordWriter | {cs["a_naive"]:.2f} | {eps["a"]:,.0f} |
| b | Pillow full decode, 2 processes | {cs["b_decode"]:.2f} | {eps["b"]:,.0f} |
| c | `evenshard convert`, DirectRunner, 2 worker processes, `--verify full` | {cs["c_convert_full"]:.2f} | {eps["c"]:,.0f} |
| d | same, `--verify header` | {cs["d_convert_header"]:.2f} | {eps["d"]:,.0f} |

| ratio | measured | aim |
|---|---:|---:|
| c / (a + b), wall clock | **{c["c_over_a_plus_b"]:.2f}** | ≤ 1.5 — {verdict(c["c_over_a_plus_b"], 1.5)} |
| c / (a + b), marginal cost per example (c at {c["images"]:,} minus c at {small.rsplit("_", 1)[1]}) | **{c["c_marginal_per_example_over_a_plus_b"]:.2f}** | — |
| fixed start-up of c (Beam + 2 worker processes) | {c["c_fixed_startup_s"]:.1f} s | — |
| d / a, wall clock | **{c["d_over_a"]:.2f}** | ≤ 3 — {verdict(c["d_over_a"], 3)} |

Peak RSS of the convert process tree (sampled from /proc every 50 ms):

| run | peak RSS |
|---|---:|
{rss_rows}

Growth with the number of images: **{c["rss_growth_bytes_per_example"] / 1e3:.2f} KB per
example** (aim ≤ 2 KB — {verdict(c["rss_growth_bytes_per_example"], 2000)}). Images of
{c["mean_image_bytes_256px"]:,} bytes instead of {c["mean_image_bytes"]:,} add
**{c["rss_256px_minus_64px_bytes_per_example"] / 1e3:.2f} KB per example**: growth is
metadata, never image bytes. It comes from the local runner: the FnApiRunner
keeps every intermediate PCollection's buffer until the job ends (its
`ListBuffer`s are never cleared), so local memory = materialized PCollections
× encoded element size. On Dataflow a worker holds one bucket or one shard
(docs/convert.md#scale).

Why a wall-clock aim can be missed at this size: a Beam job pays a fixed
start-up (import Beam, plan the graph, start 2 SDK worker processes) that is
larger than the whole baseline on small images. Per example, convert costs
{c["c_marginal_per_example_over_a_plus_b"]:.2f}× the unavoidable decode + write work, and that is what scales.
{photos}"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
