"""Near-duplicates (``--dedupe near``) on real photos: the curve, leakage, scale.

Precision and recall of the clusters against the distance, leakage between
splits before and after, and the cost at scale.

The photos: the biggest image of each of the 30 wallpapers of Debian's package
plasma-workspace-wallpapers (photographs and artwork, 2560x1600 to 5120x2880),
copied from an extracted copy at /tmp/photos when there is one, else fetched
with ``apt-get download`` and ``dpkg -x`` into benchmarks/_work/. Each is
downscaled to 1280 pixels wide (1/2 to 1/4) and cut into non-overlapping
320x240 crops, the *sources*; a crop whose grayscale standard deviation is
below 8 (nearly flat: sky, fog, a dark gradient) is skipped, since two flat
crops are the same picture to any fingerprint, not a hard negative. For a
random half of the sources, seven variants that must be caught are written
beside the source: resized x0.5 and x2, re-encoded as JPEG quality 60, cut 5%
from one edge (left, right, top, bottom in turn), brightened by 10%, converted
PNG <-> JPEG, and a byte-identical copy in another label folder. Hard
negatives that must not be grouped: every other crop (other photos and
artworks, the neighbouring crops of the same wallpaper: 0% overlap), and
*offset* crops placed 60% of a width right and half a height down from a grid
crop (at most 30% of their area in any one grid crop). One label folder a
wallpaper; a variant lands in another label folder one time in four.

(1) Precision/recall: every file is fingerprinted as convert fingerprints it
(``schemas.images.inspect_stream(..., near=True)``, checked equal to the
``.near`` files of the convert run below). For each distance 0..20, clusters
are the connected components of the pairs within that many bits; pairwise
precision and recall count the pairs in one cluster against the pairs from
one source crop, and *variant recall* is the fraction of variants in their
source's cluster. The same again for the rule convert uses (``near.matches``:
weak bits left out, thumbnails alike, the quality gate), its pairs joined as
convert clusters them (``star_clusters``: every member of a cluster a near-duplicate of
its centre).

(2) Leakage: ``evenshard convert`` on the corpus with the default flags, then
with ``--dedupe near`` (the default distance): the val and test images with a
true near-duplicate (same source crop) in train, and those whose
byte-identical copy is in train.

(3) Scale: ``convert`` with and without ``--dedupe near`` on folders of small
crops (64x48 to 128x96, 4:3, cut on grids at several scales of the same
wallpapers, flat crops skipped; a smaller folder is every k-th file of the
largest), wall time and peak RSS of the process tree.
Aims (issue 55): near / plain at most 1.5x in CPU and in peak RSS at 100,000.

    .venv/bin/python benchmarks/near_bench.py [--sample 0.5] [--sizes 20000,100000] [--repeats 1]
    .venv/bin/python benchmarks/near_bench.py --sizes ''   # scale not rerun: the last figures kept
    .venv/bin/python benchmarks/near_bench.py --render   # RESULTS.md from near_results.json
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections import Counter

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
)
from _near_corpus import VARIANTS, make_corpus, make_small  # noqa: E402
from _near_measures import (  # noqa: E402
    clusters,
    convert,
    curve,
    false_clusters,
    fingerprints,
    leaks,
    plot,
    recommend,
    sidecars,
    split_of,
)
from _near_render import render as _render  # noqa: E402

CODE = (
    "schemas/near.py",
    "schemas/near_pairs.py",
    "beam_jobs/near_duplicates.py",
    "beam_jobs/near_buckets.py",
    "beam_jobs/near_splits.py",
    "beam_jobs/near_stars.py",
    "beam_jobs/near_components.py",
    "schemas/images.py",
)  # what is measured

FLAGS = {
    "sample": (float, 0.5, "fraction of the sources given the seven variants"),
    "sizes": (str, "20000,100000", "comma list of scale-folder sizes (empty: no scale runs)", "30"),
    "repeats": (int, 1, "convert runs of each kind at each size, round-robin, best kept"),
    "quiet_wait": (float, 300.0, "seconds a scale run waits for the machine to go quiet"),
}


# ---------------------------------------------------------------- measure


def _busy(seconds: float = 3.0) -> float:
    """The fraction of the machine's cores busy over ``seconds`` (/proc/stat)."""

    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def _quiet(below: float = 0.25, wait: float = 300.0) -> float:
    """Waits (at most ``wait`` seconds) until others' work keeps under ``below`` of the
    cores busy (the machine is shared: it skews the times); returns the last reading."""
    deadline = time.perf_counter() + wait
    busy = _busy()
    while busy >= below and time.perf_counter() < deadline:
        busy = _busy()
    return round(busy, 2)


def _code() -> str:
    """A digest of the code measured: a run is refused if it changes under it (the
    working tree is shared)."""
    digest = hashlib.sha256()
    for name in CODE:
        with open(os.path.join(HERE, "..", name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def measure(a) -> dict:
    from schemas import near

    code = _code()
    start = time.perf_counter()
    images, truth = make_corpus(a.sample)
    with open(os.path.join(os.path.dirname(images), "flat.json")) as f:
        flat = json.load(f)["flat_skipped"]
    keys = sorted(truth)
    kinds = Counter(truth[k][1] for k in keys)
    made = time.perf_counter() - start
    hexes = fingerprints(images, keys)
    rows, extra = curve(keys, hexes, truth)
    chosen = recommend(rows)
    png = os.path.join(WORK if SMOKE else HERE, "near_pr.png")
    plot(rows, extra, chosen, png)
    at = {
        dist: false_clusters(images, keys, truth, extra["labels_at"][dist], extra["t"], extra["d"])
        for dist in sorted({near.DEFAULT_DISTANCE, *chosen.values()})
    }
    variant_distances = {
        k: {
            "median": float(np.median(v)),
            "p95": float(np.percentile(v, 95)),
            "max": int(max(v)),
        }
        for k, v in extra["variant_distances"].items()
        if v  # a small --sample can leave a kind (a cut's edge) without a source
    }
    negatives = {
        "same_wallpaper": extra["negative_distances_same_wallpaper"],
        "other_wallpaper": extra["negative_distances_other_wallpaper"],
    }
    negative_summary = {
        name: {
            "pairs": int(len(v)),
            "min": int(v.min()),
            "within_10": int((v <= 10).sum()),
            "within_14": int((v <= 14).sum()),
            "median": float(np.median(v)),
        }
        for name, v in negatives.items()
    }

    # (2) leakage, and convert's fingerprints against the bench's
    digest = {}
    for k in keys:
        with open(os.path.join(images, k), "rb") as f:
            digest[k] = hashlib.sha256(f.read()).hexdigest()
    plain_out = os.path.join(WORK, "near_leak_plain")
    near_out = os.path.join(WORK, "near_leak_near")
    convert(images, plain_out)
    convert(images, near_out, "--dedupe=near")
    plain_where, near_where = split_of(plain_out), split_of(near_out)
    converted = sidecars(near_out)
    mismatched = sum(converted.get(k) != h for k, h in zip(keys, hexes))
    import schemas

    near_info = schemas.load_info(near_out)["near_duplicates"]
    leakage = {
        run: {held: leaks(where, truth, digest, held) for held in ("val", "test")}
        for run, where in (("plain", plain_where), ("near", near_where))
    }

    # (3) scale
    scale, scale_from = {}, None
    sizes = [int(x) for x in a.sizes.split(",") if x]
    if not sizes and not SMOKE:  # not rerun: the last run's figures, named as such
        scale, scale_from = _previous_scale()
    for n in sorted(sizes, reverse=True):  # the largest first: the smaller link to it
        make_small(n)
    for n in sorted(sizes):
        src = make_small(n)
        out = os.path.join(WORK, "near_scale_out")
        runs: dict[str, dict] = {}
        for _ in range(a.repeats):
            for name, flags in (("plain", []), ("near", ["--dedupe=near"])):
                cmd = [
                    os.path.join(BIN, "evenshard"),
                    "convert",
                    f"--input={src}",
                    f"--output_dir={out}",
                    "--overwrite",
                    *flags,
                ]
                busy = 0.0 if SMOKE else _quiet(wait=a.quiet_wait)
                m = measured(cmd)
                m["busy_before"] = busy
                info = schemas.load_info(out)
                m["examples"] = {k: v["num_examples"] for k, v in info["splits"].items()}
                if name == "near":
                    m["near_duplicates"] = info["near_duplicates"]
                    found, work = clusters(
                        near.as_array(sidecars(out).values()), near.DEFAULT_DISTANCE
                    )
                    m["largest_cluster"] = int(np.bincount(found).max())
                    m["buckets"] = work
                shutil.rmtree(out, ignore_errors=True)
                if name not in runs or m["seconds"] < runs[name]["seconds"]:
                    runs[name] = m
        if _code() != code and not SMOKE:
            raise RuntimeError(f"{', '.join(CODE)} changed during the run: run it again")
        scale[n] = {
            **runs,
            "time_ratio": round(runs["near"]["seconds"] / runs["plain"]["seconds"], 2),
            "cpu_ratio": round(runs["near"]["cpu_seconds"] / runs["plain"]["cpu_seconds"], 2),
            "rss_ratio": round(runs["near"]["peak_rss_mb"] / runs["plain"]["peak_rss_mb"], 2),
        }
    if _code() != code and not SMOKE:  # --smoke measures nothing
        raise RuntimeError(f"{', '.join(CODE)} changed during the run: run it again")
    return {
        "corpus": {
            "wallpapers": len({truth[k][2] for k in keys}),
            "files": len(keys),
            "sources": kinds["source"],
            "sources_with_variants": kinds["copy"],
            "variants": sum(kinds[k] for k in VARIANTS),
            "offset_crops": kinds["offset"],
            "flat_skipped": flat,
            "in_another_label": sum(
                1 for k in keys if truth[k][1] in VARIANTS and k.split("/")[0] != truth[k][2]
            ),
            "seconds_to_make": round(made, 1),
        },
        "default_distance": near.DEFAULT_DISTANCE,
        "curve": rows,
        "recommended": chosen,
        "variant_distances": variant_distances,
        "variant_kinds_unsampled": sorted(set(extra["variant_distances"]) - set(variant_distances)),
        "negative_distances": negative_summary,
        "false_clusters": at,
        "png": os.path.relpath(png, HERE),
        "fingerprints_unlike_convert": mismatched,
        "leak_convert_near_duplicates": near_info,
        "leakage": leakage,
        "scale": scale,
        "scale_from": scale_from,
        "repeats": a.repeats,
        "quiet_wait": a.quiet_wait,
    }


def _previous_scale() -> tuple[dict, dict | None]:
    """The scale figures of the saved results, and when they were measured (a run with
    ``--sizes ''`` keeps them rather than dropping the section)."""
    try:
        with open(os.path.join(HERE, "near_results.json")) as f:
            old = json.load(f)
    except FileNotFoundError:
        return {}, None
    if not old.get("scale"):
        return {}, None
    when = {**old["measured"], "command": old["command"], "repeats": old.get("repeats", 1)}
    when["quiet_wait"] = old.get("quiet_wait", 300.0)
    return old["scale"], old.get("scale_from") or when


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    return _render(r, __doc__)


def _save(result: dict, seconds: float, argv: list[str]) -> None:
    """near_results.json (as run_all.py saves a result, with the command), then this
    section of RESULTS.md."""
    import datetime

    from run_all import _commit

    result["wall_seconds"] = round(seconds, 1)
    result["measured"] = {"date": datetime.date.today().isoformat(), "commit": _commit()}
    result["command"] = " ".join([".venv/bin/python benchmarks/near_bench.py", *argv])
    with open(os.path.join(HERE, "near_results.json"), "w") as f:
        json.dump(result, f, indent=2, default=str)
    _write_section()


def _write_section() -> None:
    """This benchmark's section of RESULTS.md from near_results.json: replaced where it
    is, else added at the end (run_all.py, which does not run this benchmark, drops it
    when it rewrites the file: ``near_bench.py --render`` puts it back)."""
    with open(os.path.join(HERE, "near_results.json")) as f:
        result = json.load(f)
    title, _, rest = render(result).partition("\n")
    when = result["measured"]
    origin = (
        f"Measured {when['date']} at commit {when['commit']} on {result['machine']}, in "
        f"{result['wall_seconds']} s. Command: `{result['command']}`."
    )
    section = f"{title}\n\n{origin}\n{rest}"
    replace_section(title, section)


if __name__ == "__main__":
    if sys.argv[1:] == ["--render"]:  # the section again, from the saved results
        _write_section()
    elif SMOKE:
        bench_main(measure, FLAGS, __doc__)
    else:
        began = time.perf_counter()
        _save(bench_main(measure, FLAGS, __doc__), time.perf_counter() - began, sys.argv[1:])
