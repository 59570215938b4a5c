"""The machine's limit against the readers: decode + resize from memory, one process a core.

The limit: the encoded JPEGs of the peers corpus (``_peers_corpus.make_corpus``:
real-photo crops of about ImageNet's size) held in memory, split into one share a
core, each share decoded and resized by a process of its own with the readers' own
pixel functions (``reader.decode.pixels.decode`` and ``reader.decode.pixels.resize``: libjpeg-turbo
through simplejpeg, accurate IDCT, fancy upsampling; OpenCV's bilinear) and nothing
else: no records, no parsing, no batches, no consumer. Images a second from the first
process's start to the last one's end (the processes are forked with the bytes in
memory and wait on one start signal).

The readers, each in a process of its own on the same images (``evenshard convert
--splits=train=1.0``, its defaults otherwise): ``make_dataset`` (tf.data, AUTOTUNE),
``NumpyReader`` (``num_processes`` one a core) and ``TorchReader(backend="tf")``,
one shuffled epoch in batches of 128, each image checked read once at the size asked.
A reader's rate: images a second from making it (its modules imported before) to its
last batch, and "steady": from its first batch on.

Every pass measures the limit and each reader at each size in turn (round-robin: the
machine's noise hits them alike); a reader's ratio is its rate over the limit of the
same pass, and the table shows the range over the passes. ``--baseline DIR``: another
checkout of the project (``git archive REV | tar -x -C DIR``) whose readers are measured
too, in the same passes (its rows marked "baseline"): a change's before and after
under the same load. ``--data`` and ``--corpus``: a dataset converted already and its
images (a machine that cannot convert, e.g. without Beam).

    .venv/bin/python benchmarks/limit_bench.py [--images 4000] [--passes 3] [--sizes 224,64]
        [--readers numpy,make_dataset] [--baseline DIR] [--data DIR --corpus DIR]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    HERE,
    WORK,
    bench_main,
    convert_once,
    list_images,
    run_command,
)

BATCH = 128
ROOT = os.path.dirname(HERE)  # this checkout: the readers measured
READERS = {
    "make_dataset": "`make_dataset` (tf.data, AUTOTUNE)",
    "make_dataset_python": "`make_dataset(num_processes=cores)` (the engine behind tf.data)",
    "numpy": "`NumpyReader` (`num_processes` = cores)",
    "torch_tf": '`TorchReader(backend="tf")`',
    "torch_python": '`TorchReader(backend="python")` (`num_processes` = cores)',
}

FLAGS = {
    "images": (int, 4_000, "real-photo JPEGs in the corpus (peers_bench's crops)", 40),
    "passes": (int, 3, "round-robin passes: the limit and each reader at each size", 1),
    "sizes": (str, "224,64", "comma list of square output sizes", "64"),
    "readers": (
        str,
        ",".join(READERS),
        "comma list of readers (" + ",".join(READERS) + ")",
        "make_dataset,numpy",  # --smoke: TorchReader's tf backend is frameworks_bench's
    ),
    "processes": (int, os.cpu_count() or 1, "processes of the limit (one a core)"),
    "epochs": (int, 1, "epochs each reader reads (the limit decodes each image as often)"),
    "baseline": (str, "", "another checkout whose readers are measured too (before/after)"),
    "data": (str, "", "a converted dataset of --corpus (else converted here)"),
    "corpus": (str, "", "the image folder --data was converted from"),
}

# --------------------------------------------------------------------------- the limit

_ENCODED: list[bytes] = []  # the images, set before the limit's processes fork


def _decode_share(share: int, processes: int, size: int, go, out) -> None:
    from reader.decode import pixels

    mine = _ENCODED[share::processes]
    pixels.resize(pixels.decode(mine[0], 3), (size, size))  # imports and first call
    go.wait()
    start, total = time.perf_counter(), 0
    for encoded in mine:
        total += int(pixels.resize(pixels.decode(encoded, 3), (size, size))[0, 0, 0])
    out.put((start, time.perf_counter(), len(mine), total))


def limit(encoded: list[bytes], size: int, processes: int) -> float:
    """Images a second of ``processes`` processes decoding + resizing their shares of
    ``encoded`` (in memory) to ``size`` x ``size``, from the first start to the last end."""
    global _ENCODED
    _ENCODED = encoded
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_decode_share, args=(i, processes, size, go, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process has imported and decoded its first image
    go.set()
    parts = []
    while len(parts) < len(procs):  # a process that failed says nothing: not waited for
        try:
            parts.append(out.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode for p in procs):
                raise RuntimeError("a limit process failed (its traceback is above)") from None
    for p in procs:
        p.join()
    done = sum(n for _, _, n, _ in parts)
    if done != len(encoded):
        raise RuntimeError(f"the limit decoded {done} of {len(encoded)} images")
    return done / (max(e for _, e, _, _ in parts) - min(s for s, _, _, _ in parts))


# ------------------------------------------------------------------------- the readers


def _batches(name: str, data: str, size: int, epochs: int):
    import reader

    kw = dict(seed=0, epochs=epochs, image_size=(size, size))
    if name == "make_dataset":
        for b in reader.make_dataset(data, "train", BATCH, **kw):
            yield b["image"].numpy(), _str(b["key"].numpy())
    elif name == "make_dataset_python":
        ds = reader.make_dataset(data, "train", BATCH, num_processes=os.cpu_count(), **kw)
        for b in ds.as_numpy_iterator():
            yield b["image"], _str(b["key"])
    elif name == "numpy":
        r = reader.NumpyReader(data, "train", BATCH, num_processes=os.cpu_count(), **kw)
        for b in r:
            yield b["image"], _str(b["key"])
    elif name == "torch_tf":
        from reader.torch import TorchReader

        for b in TorchReader(data, "train", BATCH, backend="tf", **kw):
            yield b["image"].numpy(), _str(b["key"])
    elif name == "torch_python":
        from reader.torch import TorchReader

        r = TorchReader(data, "train", BATCH, backend="python", num_processes=os.cpu_count(), **kw)
        for b in r:
            yield b["image"].numpy(), _str(b["key"])
    else:
        raise ValueError(name)


def _str(keys) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


IMPORTS = {
    "make_dataset": ("reader.pipeline",),
    "make_dataset_python": ("reader.pipeline",),
    "numpy": ("reader.arrays",),
    "torch_tf": ("reader.torch", "reader.pipeline"),
    "torch_python": ("reader.torch",),
}


def read_worker(name: str, data: str, size: int, epochs: int) -> dict:
    """One epoch of one reader (in a process of its own): its rates and what it read."""
    import importlib

    for module in IMPORTS[name]:
        importlib.import_module(module)
    start = time.perf_counter()
    first = None
    keys, shapes = [], set()
    for images, batch_keys in _batches(name, data, size, epochs):
        if first is None:
            first = (time.perf_counter(), len(batch_keys))
        if images.dtype != np.uint8:
            raise RuntimeError(f"{name}: images of {images.dtype}")
        shapes.add(tuple(images.shape[1:]))
        keys += batch_keys
    end = time.perf_counter()
    steady = (len(keys) - first[1]) / (end - first[0]) if end > first[0] else 0.0
    return {
        "rate": len(keys) / (end - start),
        "steady": steady,
        "keys": keys,
        "shapes": sorted(shapes),
    }


def read(name: str, data: str, size: int, count: int, epochs: int, tree: str = ROOT) -> dict:
    """``epochs`` of reader ``name`` in a process of its own, importing the reader of the
    checkout ``tree``: each of the ``count`` images read once an epoch."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--read",
        name,
        data,
        str(size),
        str(epochs),
        tree,
    ]
    # under --smoke, this checkout's reader runs here (the same --read entry)
    what, quiet = f"{name} at {size}", {"PYTHONWARNINGS": "ignore"}
    printed = run_command(cmd, what=what, env=quiet, cwd=tree)
    r = json.loads(printed.strip().splitlines()[-1])
    keys = r.pop("keys")
    if len(keys) != count * epochs or len(set(keys)) != count:
        raise RuntimeError(
            f"{name}: {len(keys)} images read, {len(set(keys))} distinct, of {count}"
        )
    if r["shapes"] != [[size, size, 3]]:
        raise RuntimeError(f"{name}: images of {r['shapes']}")
    return r


# ------------------------------------------------------------------------- the bench


def measure(a) -> dict:
    from _peers_corpus import corpus_facts, make_corpus

    if a.data:  # absolute: a baseline's readers run in its own folder
        src, data = a.corpus, os.path.abspath(a.data)
    else:
        src = make_corpus(a.images)
        out = os.path.join(WORK, f"limit_{a.images}_out")
        data = convert_once(src, out, "--splits=train=1.0")
    encoded = []
    for path, _ in list_images(src):
        with open(path, "rb") as f:
            encoded.append(f.read())
    sizes = [int(s) for s in a.sizes.split(",")]
    names = [n for n in a.readers.split(",") if n]
    trees = {n: ROOT for n in names}
    if a.baseline:
        trees.update({f"{n}@baseline": os.path.abspath(a.baseline) for n in names})
        names = [m for n in names for m in (f"{n}@baseline", n)]
    limits = {s: [] for s in sizes}
    rates = {s: {n: [] for n in names} for s in sizes}
    steady = {s: {n: [] for n in names} for s in sizes}
    loads = []
    for _ in range(a.passes):
        loads.append(round(os.getloadavg()[0], 1))
        for s in sizes:
            limits[s].append(limit(encoded * a.epochs, s, a.processes))
            for n in names:
                r = read(n.split("@")[0], data, s, len(encoded), a.epochs, trees[n])
                rates[s][n].append(r["rate"])
                steady[s][n].append(r["steady"])
    out = {}
    for s in sizes:
        lim = limits[s]
        out[str(s)] = {
            "limit": [round(v) for v in lim],
            "readers": {
                n: {
                    "rate": [round(v) for v in rates[s][n]],
                    "steady": [round(v) for v in steady[s][n]],
                    "ratio": [round(v / w, 2) for v, w in zip(rates[s][n], lim)],
                    "steady_ratio": [round(v / w, 2) for v, w in zip(steady[s][n], lim)],
                }
                for n in names
            },
        }
    return {
        "corpus": corpus_facts(src),
        "baseline": a.baseline or None,
        "passes": a.passes,
        "epochs": a.epochs,
        "processes": a.processes,
        "batch": BATCH,
        "load_at_passes": loads,
        "sizes": out,
    }


def _epochs(count: int) -> str:
    return "one shuffled epoch" if count == 1 else f"{count} shuffled epochs"


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""

    def span(values, fmt="{:,}"):
        lo, hi = min(values), max(values)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"

    rows = []
    for s, at in r["sizes"].items():
        rows.append(
            f"| {s}×{s} | **the limit** ({r['processes']} processes) | {span(at['limit'])} | | 1 | |"
        )
        for n, c in at["readers"].items():
            name = READERS[n.split("@")[0]] + (" (baseline)" if n.endswith("@baseline") else "")
            rows.append(
                f"| {s}×{s} | {name} | {span(c['rate'])} | {span(c['steady'])} | "
                f"**{span(c['ratio'], '{:.2f}')}** | {span(c['steady_ratio'], '{:.2f}')} |"
            )
    c = r["corpus"]
    return f"""## the readers against the machine's limit — `benchmarks/limit_bench.py`

The limit: {c["images"]:,} real-photo JPEGs (the peers corpus: {c["mean_kb"]} KB,
{c["mean_pixels"]:,} pixels on average) decoded and resized from memory by one process a
core with the readers' own pixel functions (`reader.decode.pixels`: simplejpeg, accurate IDCT,
fancy upsampling; OpenCV's bilinear) and nothing else. Each reader reads the same images
(converted, one split) in a process of its own, {_epochs(r.get("epochs", 1))}, batches of
{r["batch"]}; its rate from making it to its last batch ("steady": from its first batch
on). {r["passes"]} passes round-robin; the ratios are a reader's rate over the limit of
the same pass, the range over the passes. Load average at each pass:
{", ".join(str(v) for v in r["load_at_passes"])} (a shared machine: rates move, ratios less).

| size | reader | img/s | steady img/s | rate / limit | steady / limit |
|---|---|---:|---:|---:|---:|
{chr(10).join(rows)}

{"".join(n + chr(10) + chr(10) for n in r.get("notes", []))}Where the rest of the time goes, and the design that would close the gap:
docs/design.md, "Where a reader's time goes".
"""


if __name__ == "__main__":
    if sys.argv[1:2] == ["--read"]:
        name, data, size, epochs, tree = sys.argv[2:7]
        sys.path.insert(0, tree)
        print(json.dumps(read_worker(name, data, int(size), int(epochs))))
    else:
        bench_main(measure, FLAGS, __doc__)
