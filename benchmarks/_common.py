"""Helpers shared by the benchmarks: data generation, timing, peak RSS, machine facts."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "_work")
BIN = os.path.dirname(sys.executable)


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}, "
        f"{platform.machine()}"
    )


def make_jpegs(
    root: str, count: int, num_labels: int = 10, size: int = 64, sorted_labels: bool = True
) -> str:
    """``count`` small JPEGs (about 2-3 KB) over ``num_labels`` label folders; cached."""
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


def list_images(root: str) -> list[tuple[str, str]]:
    out = []
    for label in sorted(os.listdir(root)):
        d = os.path.join(root, label)
        if os.path.isdir(d):
            out += [(os.path.join(d, n), label) for n in sorted(os.listdir(d))]
    return out


def convert_once(src: str, out: str, *flags: str) -> str:
    """Converts ``src`` into ``out`` with ``evenshard convert`` unless a conversion by this
    version is there (one from before DALI indexes is converted again)."""
    import schemas
    from schemas import layout

    done = os.path.exists(layout.join(out, layout.INFO_FILE))
    if done:
        info = schemas.load_info(out)
        shards = [sh for s in info["splits"].values() for sh in s["shards"]]
        done = info["compression"] != "none" or all("dali_index" in sh for sh in shards)
    if not done:
        subprocess.run(
            [
                os.path.join(BIN, "evenshard"),
                "convert",
                f"--input={src}",
                f"--output_dir={out}",
                "--overwrite",
                *flags,
            ],
            check=True,
            capture_output=True,
        )
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


def run_measured(cmd: list[str]) -> tuple[float, int]:
    """Runs a command; returns (seconds, peak RSS of its process tree in bytes)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start
    t.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.decode()[-3000:]}")
    return seconds, peak[0]
