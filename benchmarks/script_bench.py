"""The training script's own imports in the reader's worker processes, read after read.

``reader.NumpyReader(..., num_processes=K)`` decodes in processes forked from the
multiprocessing fork server, a new set each read (each epoch, each eval read). On
Python < 3.13 each runs the training script's top level again (as ``__mp_main__``:
the server never preloads ``__main__``, cpython gh-126631): ``import torch`` and
``import tensorflow`` there cost some 5 CPU-s in every process of every read, unless
the server has imported them (``reader.routes.script_preload.script_imports``, the fix).

Two training scripts, identical but for where the heavy imports (``--imports``) sit:
"top" (at the script's top, as users write) and "main" (inside ``main()``, which the
processes never run: the ideal). Each makes R reads in a row (``--reads``, like
epochs: each a new ``NumpyReader(data, "train", 64, image_size=(64, 64), seed=0,
epochs=1, num_processes=2)``, no transform), timing each to its first batch. Each
script a process of its own, round-robin, best of ``--rounds``: its wall, and the CPU
seconds (user + system) of its whole process tree (it runs under a child subreaper,
which reaps the fork server and its processes: the script never waits for them, so
its own rusage misses them). ``--baseline REF``: the "top" script also with the
reader as of git commit REF (its tree exported, on PYTHONPATH). Datasets (``evenshard
convert --splits=train=1.0 --num_shards=8``): photo-like 500x375 JPEGs (100 labels)
and PNGs of about 64x64 (10 labels). The figure: the mean time to the first batch of
reads 2..R (read 1 also starts the server); aim top / main at most 1.2.

    .venv/bin/python benchmarks/script_bench.py [--photos 300] [--pngs 1000] [--reads 3]
        [--rounds 2] [--imports torch,tensorflow] [--baseline REF]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HERE, WORK, bench_main, convert_once, git_tree, make_photos, verdict  # noqa: E402

ROOT = os.path.dirname(HERE)  # this checkout: the reader of "top" and "main"

FLAGS = {
    "photos": (int, 300, "photo-like 500x375 JPEGs", 8),
    "pngs": (int, 1_000, "small PNGs (about 64x64)", 20),
    "reads": (int, 3, "reads a script makes in a row (like epochs), at least 2", 2),
    "rounds": (int, 2, "round-robin rounds: each script's best of these", 1),
    "imports": (str, "torch,tensorflow", "the scripts' heavy modules, comma list", "json,csv"),
    "baseline": (str, "", "a git commit whose reader runs the 'top' script too", ""),
}

SCRIPT = '''"""A training script: its heavy imports {where}."""
import json
import sys
import time
{top}
import reader


def main():
{inside}    data, reads, out = sys.argv[1], int(sys.argv[2]), []
    for _ in range(reads):
        start, first, n = time.perf_counter(), None, 0
        for batch in reader.NumpyReader(
            data, "train", 64, image_size=(64, 64), seed=0, epochs=1, num_processes=2
        ):
            first = time.perf_counter() - start if first is None else first
            n += len(batch["key"])
        out.append({{"first_batch_s": first, "read_s": time.perf_counter() - start, "records": n}})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
'''

# Runs the script (argv) as its child under PR_SET_CHILD_SUBREAPER, so the fork server
# and its processes, orphaned when the script ends, are this process's to reap: its
# children's rusage is then the whole tree's. Prints wall, CPU and what the script printed.
WRAPPER = """
import ctypes, json, os, resource, subprocess, sys, time
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0):
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, text=True)
wall = time.perf_counter() - start
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = ru.ru_utime + ru.ru_stime
print(json.dumps({"code": done.returncode, "wall": wall, "cpu": cpu, "out": done.stdout}))
"""


def write_script(name: str, modules: list[str]) -> str:
    """The script "top" or "main" in WORK, importing ``modules`` where its name says."""
    lines = [f"import {m}  # noqa: F401" for m in modules]
    top, where = ("\n".join(lines), "at its top") if name == "top" else ("", "inside main()")
    inside = "".join(f"    {line}\n" for line in lines) if name == "main" else ""
    path = os.path.join(WORK, f"script_{name}.py")
    with open(path, "w") as f:
        f.write(SCRIPT.format(where=where, top=top, inside=inside))
    return path


def make_pngs(root: str, count: int) -> str:
    """``count`` PNGs of about 64x64 in 10 label folders (``make_image_folder``); cached."""
    from evenshard.synthetic import make_image_folder

    if not os.path.exists(f"{root}/.done"):
        make_image_folder(root, 10, count // 10, formats=("png",), size=(64, 64))
        open(f"{root}/.done", "w").close()
    return root


def run_script(script: str, tree: str, data: str, reads: int, expected: int) -> dict:
    """One run of a script in a process of its own, its reader from ``tree``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=tree)
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, script, data, str(reads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=WORK)
    result = json.loads(done.stdout) if done.returncode == 0 else {"code": done.returncode}
    if result["code"]:
        raise RuntimeError(f"{script} ({tree}) failed:\n{done.stderr[-3000:]}")
    per_read = json.loads(result["out"])
    if any(r["records"] != expected for r in per_read):
        raise RuntimeError(f"{script} read {[r['records'] for r in per_read]}, not {expected}")
    return {
        "wall": round(result["wall"], 2),
        "cpu": round(result["cpu"], 2),
        "first_batch_s": [round(r["first_batch_s"], 3) for r in per_read],
        "read_s": [round(r["read_s"], 3) for r in per_read],
    }


def summary(runs: list[dict]) -> dict:
    """A contender's figures: the best over its runs of each."""
    later = [sum(r["first_batch_s"][1:]) / (len(r["first_batch_s"]) - 1) for r in runs]
    return {
        "first_batch_later_s": round(min(later), 3),
        "first_batch_read1_s": min(r["first_batch_s"][0] for r in runs),
        "best_wall": min(r["wall"] for r in runs),
        "best_cpu": min(r["cpu"] for r in runs),
        "runs": runs,
    }


def measure(a) -> dict:
    if a.reads < 2:
        raise SystemExit("--reads must be at least 2: the figure is reads 2..R")
    os.makedirs(WORK, exist_ok=True)
    modules = [m for m in a.imports.split(",") if m]
    scripts = {name: write_script(name, modules) for name in ("top", "main")}
    contenders = {"top": (scripts["top"], ROOT), "main": (scripts["main"], ROOT)}
    if a.baseline:
        tree = git_tree(a.baseline, os.path.join(WORK, "baseline_script_tree"))
        contenders["baseline_top"] = (scripts["top"], tree)
    name = f"{a.photos}_500x375_100labels"  # as preprocess_bench names its photos
    sources = {
        "photos": (make_photos(f"{WORK}/photos_{name}", a.photos, 100, (375, 500)), a.photos),
        "pngs": (make_pngs(f"{WORK}/pngs_{a.pngs}_64", a.pngs), a.pngs // 10 * 10),
    }
    flags = ("--splits=train=1.0", "--num_shards=8")
    datasets = {
        d: (convert_once(src, f"{WORK}/script_{os.path.basename(src)}", *flags), count)
        for d, (src, count) in sources.items()
    }
    loads = [round(os.getloadavg()[0], 1)]
    runs: dict = {d: {c: [] for c in contenders} for d in datasets}
    for _ in range(a.rounds):  # round-robin: a slow spell hits every contender alike
        for d, (data, count) in datasets.items():
            for c, (script, tree) in contenders.items():
                runs[d][c].append(run_script(script, tree, data, a.reads, count))
        loads.append(round(os.getloadavg()[0], 1))
    out: dict = {
        "imports": modules,
        "reads": a.reads,
        "rounds": a.rounds,
        "baseline": a.baseline,
        "cpu_measured": "user + system of the whole process tree (a child subreaper reaps it)",
        "load_1min": loads,
        "datasets": {},
    }
    for d, (_, count) in datasets.items():
        figures = {c: summary(r) for c, r in runs[d].items()}
        main = figures["main"]
        ratios = {
            f"{c}_over_main": {
                k: round(figures[c][k] / main[k], 2)
                for k in ("first_batch_later_s", "best_wall", "best_cpu")
            }
            for c in figures
            if c != "main"
        }
        out["datasets"][d] = {"images": count, "contenders": figures, "ratios": ratios}
    return out


NAMES = {"top": "imports at the top", "main": "inside `main()` (the ideal)"}


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    text = __doc__.split(chr(10), 1)[1].split("    .venv")[0].strip()
    reads, imports = r["reads"], ", ".join(f"`{m}`" for m in r["imports"])
    out = f"""## The training script's imports in the reader's processes — `benchmarks/script_bench.py`

{text}

Heavy imports: {imports}; {reads} reads a script, {r["rounds"]} rounds round-robin. The
1-minute load average at the start and after each round: {r["load_1min"]} (2 cores).
"""
    names = {**NAMES, "baseline_top": f"at the top, reader as of {r['baseline']}"}
    for d, part in r["datasets"].items():
        rows = "\n".join(
            f"| {names[c]} "
            f"| **{f['first_batch_later_s']:.2f}** "
            f"| {f['first_batch_read1_s']:.2f} "
            f"| {' / '.join(str(x['wall']) for x in f['runs'])} | {f['best_wall']:.1f} "
            f"| {f['best_cpu']:.1f} |"
            for c, f in part["contenders"].items()
        )
        ratio_rows = "\n".join(
            f"| {c.replace('_over_main', '')} / main | **{v['first_batch_later_s']:.2f}**"
            + (
                f" (≤ 1.2 — {verdict(v['first_batch_later_s'], 1.2)})"
                if c == "top_over_main"
                else ""
            )
            + f" | {v['best_wall']:.2f} | {v['best_cpu']:.2f} |"
            for c, v in part["ratios"].items()
        )
        fig = part["contenders"]
        gap = (fig["top"]["first_batch_later_s"] - fig["main"]["first_batch_later_s"]) * 1e3
        out += f"""
{d} ({part["images"]:,} images); top − main, first batch of reads 2..{reads}: {gap:+.0f} ms.

| script | first batch s, reads 2..{reads} (mean) | first batch s, read 1 | wall s, each round | best wall s | best CPU s |
|---|---:|---:|---|---:|---:|
{rows}

| ratio | first batch, reads 2..{reads} | wall | CPU |
|---|---:|---:|---:|
{ratio_rows}
"""
    return out


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
