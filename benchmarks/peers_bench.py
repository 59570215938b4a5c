"""evenshard against its peers on real photos: write time, read rate, label mix.

The corpus: crops of the 30 wallpapers of Debian's package
plasma-workspace-wallpapers (photographs and artwork, 2560x1600 to 5120x2880;
``near_bench.wallpapers()`` gets them), not synthetic noise. Image i of N has
label i * 100 // N (100 label folders, label-sorted, ``label_LLL/img_IIIIII.jpg``);
label l is cut from wallpaper l mod 30, from a vertical strip of its own (the 3 or
4 labels of one wallpaper take its strips in turn). Each crop is a random box
(long side 420 to 760 px of the original, aspect 1.2 to 1.5, one in five
portrait) resized (Lanczos) to 500 px on the long side (500x333 to 500x417, about
ImageNet's pixel count) and saved as JPEG quality 85 to 90; cached in
benchmarks/_work/.

The peers run in a virtual environment of their own (benchmarks/_work/peers-venv,
made and filled by this script with pinned releases, so the project's pins stay);
evenshard and the plain tf.data loop run with the project's .venv. Each write and
each read is a process of its own (benchmarks/_peers_worker.py). Every writer is fed
the label-sorted listing and stores each image's index and label beside its bytes;
evenshard's is ``evenshard convert --splits=train=1.0`` (one split holding every
image; its other flags the defaults, ``--verify full`` among them).
Write: wall seconds of the process (imports included) and CPU seconds of its
process tree. Read: one shuffled epoch, decode + resize to 224x224, batches of 128,
images a second from making the loader to its last batch (imports excluded), best
of the passes, taken round-robin so the machine's noise hits every tool alike.
Every pass is checked: each index read exactly once, each label the one written,
every image 224x224x3 uint8. The label mix: the mean over batches of the distinct
labels among a batch's images over its expectation for as many images drawn at
random (``preprocess_bench.label_mix``), shown inverted (random / this: 1.00 is a
random draw, 5 means five times fewer labels a batch), the mean over the passes.
Each reader uses its own shuffle with its documented settings and 2 worker
processes where it has workers (the machine has 2 cores); the table says which.
The per-image work is the same everywhere: the Python readers (the peers and
``NumpyReader``) decode with libjpeg-turbo through simplejpeg and resize with
OpenCV's bilinear (no antialiasing), as evenshard's Python route does, and as its
tf.data route does too (one Python call a batch, ``reader/decode/pixels.py``); the plain
tf.data loop with ``decode_jpeg`` and ``tf.image.resize`` (bilinear, no
antialiasing).
One more torchvision row shows the route of its docs instead (Pillow's loader and
``Resize``, whose bilinear antialiases): what a reader pays for Pillow.

    .venv/bin/python benchmarks/peers_bench.py [--images 20000] [--passes 3] [--tools all]
    .venv/bin/python benchmarks/peers_bench.py --render   # the section from the saved JSON
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    BIN,
    HERE,
    SMOKE,
    WORK,
    bench_main,
    measured,
    replace_section,
    run_command,
    tiny,
)
from _peers_corpus import LABELS, corpus_facts, make_corpus  # noqa: E402
from _peers_tools import PEERS_VENV, TOOLS, peers_venv, project_versions  # noqa: E402

__all__ = ["corpus_facts", "make_corpus"]  # limit_bench.py takes the corpus from here

WORKER = os.path.join(HERE, "_peers_worker.py")
PROJECT_PY = os.path.join(BIN, "python")

FLAGS = {
    "images": (int, 20_000, "JPEGs in the corpus", 40),
    "passes": (int, 3, "read passes of each tool, round-robin, best kept", 1),
    "tools": (
        str,
        "all",
        "comma list of tools to run (" + ",".join(TOOLS) + ")",
        # --smoke: TorchReader's backends are frameworks_bench.py's; the peers, left out
        ",".join(t for t in TOOLS if not t.startswith("evenshard_torch")),
    ),
}


# ------------------------------------------------------------------------ the runs


def _python(where: str) -> str:
    return PROJECT_PY if where == "project" else os.path.join(PEERS_VENV, "bin", "python")


def _warm(src: str) -> None:
    """Reads every file under ``src`` once, into the page cache."""
    for folder, _, names in os.walk(src):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def write(tool: str, src: str, out: str) -> dict:
    """One write, measured: wall and CPU seconds of the process tree."""
    if tool == "evenshard":
        evenshard = os.path.join(BIN, "evenshard")
        flags = ("--splits=train=1.0", "--verify=full", "--overwrite")
        cmd = [evenshard, "convert", f"--input={src}", f"--output_dir={out}", *flags]
        result = measured(cmd)
        size = sum(
            os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(out) for n in names
        )
        return {**result, "bytes": size}
    where = "project" if tool == "tf_plain" else "peers"
    facts = os.path.join(WORK, f"peers_write_{tool}.json")
    result = measured([_python(where), WORKER, "write", tool, src, out, facts])
    with open(facts) as f:
        return {**result, **json.load(f)}


def read(tool: str, data: str, count: int, label_of: np.ndarray) -> dict:
    """One read in a process of its own, checked; its rate and batches' labels."""
    load = os.getloadavg()[0]  # the machine is shared: what ran just before, roughly
    start = time.perf_counter()
    cmd = [_python(TOOLS[tool][1]), WORKER, "read", tool, data, str(count)]
    printed = run_command(cmd, what=f"{tool} read", env={"PYTHONWARNINGS": "ignore"})
    wall = time.perf_counter() - start
    r = json.loads(printed.strip().splitlines()[-1])
    indices = np.concatenate([np.asarray(b, dtype=np.int64) for b in r["indices"]])
    labels = np.concatenate([np.asarray(b, dtype=np.int64) for b in r["labels"]])
    seen = np.bincount(indices, minlength=count) if len(indices) else np.zeros(count, int)
    problems = []
    if len(indices) != count:
        problems.append(f"read {len(indices)} images, expected {count}")
    if len(seen) != count or (seen != 1).any():
        problems.append(
            f"{int((seen == 0).sum())} never read, {int((seen > 1).sum())} read more than once"
        )
    if len(indices) == len(labels) and (labels != label_of[np.minimum(indices, count - 1)]).any():
        problems.append("labels differ from the labels written")
    shapes = [tuple(s) for s in r["image_shapes"]]
    if shapes not in ([(224, 224, 3)], [(3, 224, 224)]):
        problems.append(f"images of {shapes}")
    if problems:
        raise RuntimeError(f"{tool}: " + "; ".join(problems))
    return {
        "images_per_s": count / r["seconds"],
        "seconds": r["seconds"],
        "process_seconds": wall,
        "load_before": load,
        "batches": [np.asarray(b) for b in r["labels"]],
        "backend": r.get("backend"),
    }


def measure(a) -> dict:
    from preprocess_bench import label_mix

    began = time.perf_counter()
    chosen = list(TOOLS) if a.tools == "all" else a.tools.split(",")
    unknown = [t for t in chosen if t not in TOOLS]
    if unknown:
        raise SystemExit(f"unknown tools {unknown}; known: {', '.join(TOOLS)}")
    venv = peers_venv()
    src = make_corpus(a.images)
    corpus = corpus_facts(src)
    count = corpus["images"]
    label_of = np.arange(count) * LABELS // count
    counts = np.bincount(label_of, minlength=LABELS)
    out_dir = os.path.join(WORK, f"peers_out_{count}")
    failed: dict[str, str] = {}
    for tool in chosen:
        missing = [p for p in TOOLS[tool][4] if p in venv["failed"]]
        if missing:
            failed[tool] = f"not installed: {', '.join(missing)} ({venv['failed'][missing[0]]})"

    writes: dict[str, dict] = {}
    needed = {TOOLS[t][3] for t in chosen} - {"src"}
    # Each writer starts with the source in the page cache (read once, untimed):
    # the first writer of a run used to read it from disk for the others (a
    # profile of convert spent 17 s of its samples in that first read). Two
    # passes, round-robin, the faster of each writer's kept.
    for _ in range(tiny(2, 1)):
        for tool in [t for t in TOOLS if t in needed]:  # the tools that write what is read
            if tool in failed:
                continue
            _warm(src)
            try:
                got = write(TOOLS[tool][2], src, os.path.join(out_dir, TOOLS[tool][2]))
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                failed[tool] = f"write: {str(e)[-1500:]}"
            else:
                if tool not in writes or got["seconds"] < writes[tool]["seconds"]:
                    writes[tool] = got
            print(f"write {tool}: {writes.get(tool, failed.get(tool))}", file=sys.stderr)

    best: dict[str, dict] = {}
    mixes: dict[str, list[dict]] = {}
    rates: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {}  # the 1-minute load average before each pass
    for p in range(a.passes):
        for tool in chosen:
            data = TOOLS[tool][3]
            if tool not in failed and data != "src" and data not in writes:
                failed[tool] = f"its data was not written ({data})"
            if tool in failed:
                continue
            path = src if data == "src" else os.path.join(out_dir, TOOLS[data][2])
            try:
                r = read(tool, path, count, label_of)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                failed[tool] = f"read: {str(e)[-1500:]}"
                continue
            mixes.setdefault(tool, []).append(label_mix(r.pop("batches"), counts))
            rates.setdefault(tool, []).append(r["images_per_s"])
            loads.setdefault(tool, []).append(round(r["load_before"], 2))
            if r["images_per_s"] > best.get(tool, {}).get("images_per_s", 0.0):
                best[tool] = r
            print(f"pass {p + 1} {tool}: {r['images_per_s']:.0f} img/s", file=sys.stderr)

    skipped = {t: why for t, why in failed.items() if why.startswith("not installed")}
    if SMOKE and len(skipped) < len(failed):  # a run records a failure; a smoke run fails
        raise RuntimeError(f"failed: { {t: w for t, w in failed.items() if t not in skipped} }")
    rows = {}
    for tool in chosen:
        if tool in failed:
            rows[tool] = {"failed": failed[tool]}
            continue
        over = float(np.mean([m["over_random"] for m in mixes[tool]]))
        w = writes.get(tool)
        rows[tool] = {
            "write": w,
            "read": {k: round(v, 2) if isinstance(v, float) else v for k, v in best[tool].items()},
            "images_per_s": round(best[tool]["images_per_s"]),
            "passes_images_per_s": [round(x) for x in rates[tool]],
            "passes_load_before": loads[tool],
            "label_mix": mixes[tool],
            "over_random": round(over, 3),
            "random_over_this": round(1 / over, 2),
        }
    return {
        "corpus": corpus,
        "passes": a.passes,
        "batch": 128,
        "image_size": [224, 224],
        "peers_venv": {"versions": venv["versions"], "failed": venv["failed"]},
        "project_versions": project_versions(),
        "tools": rows,
        "seconds": round(time.perf_counter() - began, 1),
        **({"smoke_skipped": skipped} if SMOKE else {}),
    }


# ------------------------------------------------------------------------- the section


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    text = __doc__.split(chr(10), 1)[1].split("    .venv")[0].strip()
    c = r["corpus"]
    lines = []
    for tool, row in r["tools"].items():
        what, where, *_, how = TOOLS[tool]
        if "failed" in row:
            lines.append(f"| {what} | failed: {row['failed'][:200]} | | | | |")
            continue
        w = row["write"]
        ws = f"{w['seconds']:.1f} ({w['cpu_seconds']:.1f})" if w else "–"
        if tool == "evenshard_torch" and row["read"].get("backend"):
            how = how.replace("see `backend`", f'`backend="{row["read"]["backend"]}"`')
        passes = " / ".join(f"{x:,}" for x in row["passes_images_per_s"])
        lines.append(
            f"| {what} | {ws} | {row['images_per_s']:,} | {passes} "
            f"| {row['random_over_this']:.2f} | {how} |"
        )
    rows = "\n".join(lines)
    v = r["peers_venv"]["versions"]
    pv = r["project_versions"]
    peers = ", ".join(f"{k} {v[k]}" for k in sorted(v))
    project = ", ".join(f"{k} {pv[k]}" for k in sorted(pv))
    failed = r["peers_venv"]["failed"]
    ok = [row for row in r["tools"].values() if "failed" not in row]
    loads = [x for row in ok for x in row.get("passes_load_before", [])]
    spread = max(
        (1 - min(row["passes_images_per_s"]) / max(row["passes_images_per_s"]) for row in ok),
        default=0.0,
    )
    noise = (
        f"The 1-minute load average before each read was {min(loads):.1f} to {max(loads):.1f} "
        f"(this bench alone keeps it near 2 on 2 cores); one tool's passes differ by up to "
        f"{100 * spread:.0f}%, so rates closer than that are a tie.\n"
        if loads
        else ""
    )
    out = f"""## peers — `benchmarks/peers_bench.py`

{text}

{c["images"]:,} JPEGs, {c["mean_kb"]} KB on average ({c["mb"]:,} MB), {c["mean_pixels"]:,} pixels
on average, {c["labels"]} labels; best of {r["passes"]} read passes, decode + resize to
224x224, batches of 128, one shuffled epoch.

| tool | write s (CPU s) | read img/s (best) | each pass | label mix (random / this; writers fed label-sorted input) | how it reads |
|---|---:|---:|---:|---:|---|
{rows}

The write column is the whole process (imports and start-up included: Beam's for
convert, TensorFlow's for the plain loop), the faster of two round-robin passes,
each started with the source in the page cache; evenshard convert also decodes every
image to check it (`--verify full`), fingerprints nothing, and shuffles globally.
{noise}Peers' environment: {peers}. Project's: {project}.
"""
    if failed:
        out += "Not installed: " + "; ".join(f"{k}: {' '.join(e)}" for k, e in failed.items())
        out += "\n"
    return out


def _save(result: dict, seconds: float, argv: list[str]) -> None:
    """peers_results.json (as run_all.py saves a result), and this section of RESULTS.md."""
    import datetime

    from run_all import _commit

    result["wall_seconds"] = round(seconds, 1)
    result["measured"] = {"date": datetime.date.today().isoformat(), "commit": _commit()}
    result["command"] = " ".join([".venv/bin/python benchmarks/peers_bench.py", *argv])
    with open(os.path.join(HERE, "peers_results.json"), "w") as f:
        json.dump(result, f, indent=2, default=str)
    write_section(json.loads(json.dumps(result, default=str)))


def write_section(result: dict) -> None:
    """This section of RESULTS.md, in place (or at the end), from ``result``; the
    other sections as they are."""
    text = render(result)
    title, _, rest = text.partition("\n")
    command = result.get("command", ".venv/bin/python benchmarks/peers_bench.py")
    origin = (
        f"Measured {result['measured']['date']} at commit {result['measured']['commit']} on "
        f"{result['machine']}, in {result['wall_seconds']} s. Command: `{command}`."
    )
    section = f"{title}\n\n{origin}\n{rest}".rstrip("\n") + "\n"
    replace_section(title, section)


if __name__ == "__main__":
    if sys.argv[1:] == ["--render"]:  # the section again from peers_results.json
        with open(os.path.join(HERE, "peers_results.json")) as f:
            write_section(json.load(f))
    elif SMOKE:
        bench_main(measure, FLAGS, __doc__)
    else:
        began = time.perf_counter()
        _save(bench_main(measure, FLAGS, __doc__), time.perf_counter() - began, sys.argv[1:])
