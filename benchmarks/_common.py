"""Helpers shared by the benchmarks: data generation, timing, peak RSS, machine facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# ``--smoke``: tiny sizes in a folder of their own (tests/test_benchmarks_smoke.py): the
# benchmark runs end to end and its checks hold; its timings mean nothing, and it
# writes no results (the JSON is printed, no *_results.json, RESULTS.md or figure)
SMOKE = "--smoke" in sys.argv[1:]
WORK = os.environ.get("EVENSHARD_BENCH_WORK") or os.path.join(
    HERE, "_work", *(["smoke"] if SMOKE else [])
)
BIN = os.path.dirname(sys.executable)
# ``--smoke`` with EVENSHARD_BENCH_SHARED (tests/test_benchmarks_smoke.py sets it): a
# folder the smoke runs share, where a generated JPEG folder or a conversion that two
# benchmarks ask for alike (the same images, the same flags) is made once, under a lock
SHARED = os.environ.get("EVENSHARD_BENCH_SHARED") if SMOKE else None


class _shared_lock:
    """An exclusive lock on ``path`` + ".lock" (another smoke run may make it now)."""

    def __init__(self, path: str):
        self.path = path + ".lock"

    def __enter__(self):
        import fcntl

        os.makedirs(WORK, exist_ok=True)  # as a benchmark's own corpus would have made it
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        self.f.close()  # the lock goes with the file


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}, "
        f"{platform.machine()}"
    )


def make_jpegs(
    root: str, count: int, num_labels: int = 10, size: int = 64, sorted_labels: bool = True
) -> str:
    """``count`` small JPEGs (about 2-3 KB) over ``num_labels`` label folders; cached.
    Under ``SHARED``, in that folder (the same arguments give the same images): its
    path is returned."""
    if SHARED:
        root = os.path.join(SHARED, f"jpegs_{count}_{num_labels}_{size}_{int(sorted_labels)}")
        with _shared_lock(root):
            return _make_jpegs(root, count, num_labels, size, sorted_labels)
    return _make_jpegs(root, count, num_labels, size, sorted_labels)


def _make_jpegs(root: str, count: int, num_labels: int, size: int, sorted_labels: bool) -> str:
    from evenshard.synthetic import image_bytes

    done = os.path.join(root, ".done")
    if os.path.exists(done):
        return root
    rng = np.random.default_rng(0)
    for i in range(count):
        label = i * num_labels // count if sorted_labels else i % num_labels
        d = os.path.join(root, f"label_{label:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img_{i:06d}.jpg"), "wb") as f:
            f.write(image_bytes("jpeg", size, size, rng))
    open(done, "w").close()
    return root


def make_photos(root: str, count: int, num_labels: int, size: tuple[int, int]) -> str:
    """``count`` photo-like JPEGs of ``size`` (height, width) in ``num_labels`` label
    folders (label-sorted, as ``make_jpegs``); cached. Under ``SHARED``, in that folder
    (as ``make_jpegs``): its path is returned."""
    if SHARED:
        root = os.path.join(SHARED, f"photos_{count}_{size[1]}x{size[0]}_{num_labels}")
        with _shared_lock(root):
            return _make_photos(root, count, num_labels, size)
    return _make_photos(root, count, num_labels, size)


def _make_photos(root: str, count: int, num_labels: int, size: tuple[int, int]) -> str:
    from evenshard.synthetic import photo_bytes

    done = os.path.join(root, ".done")
    if os.path.exists(done):
        return root
    rng = np.random.default_rng(0)
    for i in range(count):
        d = os.path.join(root, f"label_{i * num_labels // count:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img_{i:06d}.jpg"), "wb") as f:
            f.write(photo_bytes(rng, *size))
    open(done, "w").close()
    return root


def git_tree(ref: str, tree: str) -> str:
    """The project as of git commit ``ref``, exported to the folder ``tree`` (emptied
    first: ``git archive REF | tar -x -C TREE``), for a before/after in one sitting: a
    contender run there (cwd or PYTHONPATH) imports that commit's code. Returns ``tree``."""
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    root = os.path.dirname(HERE)
    archive = subprocess.run(["git", "archive", ref], cwd=root, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def list_images(root: str) -> list[tuple[str, str]]:
    out = []
    for label in sorted(os.listdir(root)):
        d = os.path.join(root, label)
        if os.path.isdir(d):
            out += [(os.path.join(d, n), label) for n in sorted(os.listdir(d))]
    return out


def convert_once(src: str, out: str, *flags: str) -> str:
    """Converts ``src`` into ``out`` with ``evenshard convert`` unless a conversion by this
    version is there (one from before DALI indexes is converted again); returns where
    the conversion is. Under ``SHARED``, a shared source's conversion is in that folder,
    one for each source and flags, and read only by the benchmarks."""
    if SHARED and os.path.dirname(os.path.abspath(src)) == os.path.abspath(SHARED):
        name = "__".join([os.path.basename(src), *(f.strip("-") for f in flags)])
        out = os.path.join(SHARED, "converted", name.replace("/", "_").replace("=", "-"))
        with _shared_lock(out):
            return _convert_once(src, out, *flags)
    return _convert_once(src, out, *flags)


def _convert_once(src: str, out: str, *flags: str) -> str:
    import schemas
    from schemas import layout

    done = os.path.exists(layout.join(out, layout.INFO_FILE))
    if done:
        info = schemas.load_info(out)
        shards = [sh for s in info["splits"].values() for sh in s["shards"]]
        done = info["compression"] != "none" or all("dali_index" in sh for sh in shards)
    if not done:
        cmd = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}", f"--output_dir={out}"]
        run_command([*cmd, "--overwrite", *flags], what=f"evenshard convert {src}")
    return out


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


def _tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of a process and each of its descendants."""
    out, stack, tick = {}, [pid], os.sysconf("SC_CLK_TCK")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[p] = (int(fields[11]) + int(fields[12])) / tick
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
    return out


def in_process(cmd: list[str]) -> bool:
    """Whether ``cmd`` runs in this process (``run_here``): under ``--smoke`` only, an
    ``evenshard`` command or a script (or ``-c``) of this interpreter. A smoke checks
    each contender's code and its results, not its process; a fresh process would
    import TensorFlow (3-6 CPU seconds) or Beam (2) again for a few images."""
    python = (sys.executable, os.path.join(BIN, "python"))
    return SMOKE and (cmd[0] == os.path.join(BIN, "evenshard") or cmd[0] in python)


def run_here(cmd: list[str]) -> str:
    """Runs ``cmd`` (``in_process``) here as its own process would run it: its argv,
    TF_CPP_MIN_LOG_LEVEL=3, its exit code checked; returns what it printed."""
    import runpy
    import tempfile

    argv, env, code = sys.argv, dict(os.environ), 0
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile("w+") as printed:
        os.dup2(printed.fileno(), 1)  # what it prints is its own, as from a process
        try:
            if cmd[0] == os.path.join(BIN, "evenshard"):
                from beam_jobs import runners
                from evenshard.cli import main

                if cmd[1] == "convert" and runners.runs_locally(cmd[2:]):
                    runners.lean_imports()  # as the command does (evenshard.cli.run)
                code = main(cmd[1:])
            elif cmd[1] == "-c":
                sys.argv = ["-c", *cmd[3:]]
                exec(cmd[2], {"__name__": "__main__"})
            else:
                sys.argv = cmd[1:]
                runpy.run_path(cmd[1], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            sys.argv = argv
            os.environ.clear()
            os.environ.update(env)
        printed.seek(0)
        out = printed.read()
    if code:
        raise RuntimeError(f"{' '.join(cmd)} failed: exit code {code}")
    return out


def runs_here(cmd: list[str], cwd: str | None = None) -> bool:
    """Whether ``cmd``, run in ``cwd``, runs here (``run_here``): ``in_process``, and in
    this checkout; another commit's tree always gets a process of its own."""
    return in_process(cmd) and cwd in (None, os.path.dirname(HERE))


def run_command(
    cmd: list[str], what: str | None = None, env: dict | None = None, cwd: str | None = None
) -> str:
    """What ``cmd`` prints: run here under ``--smoke`` (``in_process``), else in its own
    process (TF_CPP_MIN_LOG_LEVEL=3, and ``env``; in ``cwd``); a failure raises, naming
    ``what`` (the command by default) and, from a process, the tail of its stderr. A
    ``cwd`` other than this checkout (another commit's tree) always gets a process."""
    if runs_here(cmd, cwd):
        return run_here(cmd)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode:
        raise RuntimeError(f"{what or ' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def run_measured(cmd: list[str], phases: dict | None = None) -> tuple[float, int]:
    """Runs a command; returns (seconds, peak RSS of its process tree in bytes).

    ``phases``: filled with where the cores went, sampled every 0.25 s:
    ``one_core_seconds`` (intervals using under 1.25 cores), of which
    ``main_alone_seconds`` (only the command's own process busy) and
    ``one_child_seconds`` (one child process busy, e.g. one Beam worker).
    Under ``--smoke`` a command ``in_process`` runs here: the peak RSS is this
    process's, the phases are zeros (figures that mean nothing at a tiny size).
    """
    if in_process(cmd):
        start = time.perf_counter()
        run_here(cmd)
        seconds = time.perf_counter() - start
        if phases is not None:
            phases.update(one_core_seconds=0.0, main_alone_seconds=0.0, one_child_seconds=0.0)
        return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    os.sync()  # the previous contender's writes are flushed before this one starts
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = [0]
    counts = {"one_core_seconds": 0.0, "main_alone_seconds": 0.0, "one_child_seconds": 0.0}

    def sample():
        last, last_t = {}, time.perf_counter()
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if phases is not None:
                now, t = _tree_cpu(proc.pid), time.perf_counter()
                busy = {p: (c - last.get(p, c)) / (t - last_t) for p, c in now.items()}
                if last and sum(busy.values()) < 1.25:
                    counts["one_core_seconds"] += t - last_t
                    working = [p for p, b in busy.items() if b > 0.5]
                    if working == [proc.pid]:
                        counts["main_alone_seconds"] += t - last_t
                    elif len(working) == 1:
                        counts["one_child_seconds"] += t - last_t
                last, last_t = now, t
            time.sleep(0.25 if phases is not None else 0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start
    t.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.decode()[-3000:]}")
    if phases is not None:
        phases.update({k: round(v, 1) for k, v in counts.items()})
    return seconds, peak[0]


def measured(cmd: list[str], phases: bool = False) -> dict:
    """Wall seconds, CPU seconds (the process and every child it waited for), peak RSS;
    with ``phases``, where the cores went (``run_measured``)."""
    where: dict | None = {} if phases else None
    here = in_process(cmd)  # --smoke: a run here may take under 0.05 s
    who = (resource.RUSAGE_CHILDREN, *([resource.RUSAGE_SELF] if here else []))
    before = [resource.getrusage(w) for w in who]
    seconds, rss = run_measured(cmd, where)
    after = [resource.getrusage(w) for w in who]
    cpu = sum(a.ru_utime - b.ru_utime + a.ru_stime - b.ru_stime for a, b in zip(after, before))
    return {
        "seconds": round(seconds, 3 if here else 1),
        "cpu_seconds": round(cpu, 1),
        "cores_used": round(cpu / seconds, 2),
        "peak_rss_mb": round(rss / 1e6),
        **({"phases": where} if phases else {}),
    }


def tiny(full, smoke):
    """``smoke`` under ``--smoke``, else ``full``: a size a benchmark fixes itself."""
    return smoke if SMOKE else full


def missing(module: str) -> str | None:
    """Why a contender that needs ``module`` is left out under ``--smoke``: not
    installed here (for the result's ``smoke_skipped``); None when it runs. A full run
    leaves nothing out: a missing module fails it."""
    import importlib.util

    if SMOKE and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def bench_main(measure, flags: dict, doc: str) -> dict:
    """The main every benchmark shares: its flags (name -> (type, default, help[,
    default under --smoke])), ``measure(args)``, and the result printed as JSON with
    the machine it ran on."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes: check it runs, no results")
    for name, (kind, default, text, *small) in flags.items():
        default = small[0] if SMOKE and small else default
        p.add_argument(f"--{name}", type=kind, default=default, help=text)
    result = {"machine": machine(), **measure(p.parse_args())}
    print(json.dumps(result, indent=2, default=str))
    return result


def verdict(value: float, limit: float, below: bool = True) -> str:
    """ "met" or "missed": ``value`` at most (``below``) or at least ``limit``, judged as
    the tables show it (two decimals)."""
    value = round(value, 2)
    ok = value <= limit if below else value >= limit
    return "met" if ok else "missed"


def table_rows(items, cells) -> str:
    """Markdown table rows: ``cells(key, value)`` gives one row's cells as strings."""
    return "\n".join("| " + " | ".join(cells(k, v)) + " |" for k, v in items)


def replace_section(title: str, section: str) -> None:
    """Writes ``section`` into RESULTS.md in place of the one headed ``title`` (appended
    when there is none), for a benchmark that writes its own section."""
    path = os.path.join(HERE, "RESULTS.md")
    with open(path) as f:
        md = f.read()
    head, found, tail = md.partition(title)
    if found:
        after = tail.find("\n## ")
        md = head + section + ("\n" + tail[after + 1 :] if after >= 0 else "")
    else:
        md = md.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(md)
