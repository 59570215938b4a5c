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
convert joins them (``clusters_of``: bounded at 1 % of the inputs).

(2) Leakage: ``evenshard convert`` on the corpus with the default flags, then
with ``--dedupe near`` (the default distance): the val and test images with a
true near-duplicate (same source crop) in train, and those whose
byte-identical copy is in train.

(3) Scale: ``convert`` with and without ``--dedupe near`` on folders of small
crops (64x48 to 128x96, 4:3, cut on grids at several scales of the same
wallpapers, flat crops skipped; a smaller folder is every k-th file of the
largest), wall time and peak RSS of the process tree.
Aims: near / plain at most 1.3x in time, peak RSS flat in the input count.

    .venv/bin/python benchmarks/near_bench.py [--sample 0.5] [--sizes 20000,100000] [--repeats 1]
    .venv/bin/python benchmarks/near_bench.py --sizes ''   # scale not rerun: the last figures kept
    .venv/bin/python benchmarks/near_bench.py --render   # RESULTS.md from near_results.json
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import subprocess
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
    table_rows,
    tiny,
    verdict,
)

PACKAGE = "plasma-workspace-wallpapers"
EXTRACTED = "/tmp/photos/x/usr/share/wallpapers"  # an extracted copy, used when present
WALLPAPERS = os.path.join(WORK, "wallpapers")
WIDTH = tiny(1280, 640)  # each wallpaper downscaled to this width: 1/2 to 1/4
CROP = (320, 240)
OFFSET = (0.6, 0.5)  # offset crops: this fraction of a crop right and down from a grid crop
FLAT_STD = 8.0  # grayscale standard deviation under which a crop is flat and skipped
VARIANTS = ("half", "double", "q60", "cut5", "bright", "other_format", "copy")
EDGES = ("left", "right", "top", "bottom")
MAX_DISTANCE = 20
CODE = ("schemas/near.py", "beam_jobs/near.py", "schemas/images.py")  # what is measured
SPLITS = ("train", "val", "test")  # convert's default splits
OTHER_LABEL = 0.25  # the chance a variant (not the copy: always) goes to another label
SMALL = (64, 128)  # width range of the scale corpus's crops (4:3)
SCALES = (1.0, 0.85, 0.7, 0.6, 0.5, 0.35, 0.25)  # the scale corpus: each wallpaper at these scales,
PHASES = ((0, 0), (0.5, 0.5), (0.5, 0), (0, 0.5))  # cut on grids shifted by these fractions

FLAGS = {
    "sample": (float, 0.5, "fraction of the sources given the seven variants"),
    "sizes": (str, "20000,100000", "comma list of scale-folder sizes (empty: no scale runs)", "30"),
    "repeats": (int, 1, "convert runs of each kind at each size, round-robin, best kept"),
}


# ---------------------------------------------------------------- the photos


def _download() -> str:
    """The package's wallpaper folder, fetched with apt-get download and dpkg -x."""
    deb = os.path.join(WORK, "wallpapers_deb")
    os.makedirs(deb, exist_ok=True)
    if not glob.glob(os.path.join(deb, "*.deb")):
        subprocess.run(["apt-get", "download", PACKAGE], cwd=deb, check=True)
    root = os.path.join(deb, "x")
    subprocess.run(["dpkg", "-x", glob.glob(os.path.join(deb, "*.deb"))[0], root], check=True)
    return os.path.join(root, "usr", "share", "wallpapers")


def wallpapers() -> list[str]:
    """The biggest image (in pixels) of each wallpaper, copied into _work/wallpapers."""
    from PIL import Image

    if SMOKE:  # nothing downloaded: a real photo (matplotlib's sample) and its mirror
        return _smoke_wallpapers()
    done = os.path.join(WALLPAPERS, ".done")
    if not os.path.exists(done):
        src = EXTRACTED if os.path.isdir(EXTRACTED) else _download()
        os.makedirs(WALLPAPERS, exist_ok=True)
        for name in sorted(os.listdir(src)):
            images = glob.glob(os.path.join(src, name, "contents", "images", "*"))
            if not images:
                continue

            def pixels(path):
                with Image.open(path) as im:
                    return im.width * im.height

            best = max(images, key=pixels)
            shutil.copy(best, os.path.join(WALLPAPERS, name + os.path.splitext(best)[1]))
        open(done, "w").close()
    return sorted(p for p in glob.glob(os.path.join(WALLPAPERS, "*")) if not p.endswith(".done"))


def _smoke_wallpapers() -> list[str]:
    from matplotlib import cbook
    from PIL import Image, ImageOps

    os.makedirs(WALLPAPERS, exist_ok=True)
    paths = [os.path.join(WALLPAPERS, "hopper.jpg"), os.path.join(WALLPAPERS, "mirrored.png")]
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as im:
        im.convert("RGB").save(paths[0], quality=95)
        ImageOps.mirror(im.convert("RGB")).save(paths[1])
    return paths


def _open(path: str):
    """(name, "jpeg" or "png", the RGB image, its original size)."""
    from PIL import Image

    with Image.open(path) as im:
        fmt = "jpeg" if im.format == "JPEG" else "png"
        return os.path.splitext(os.path.basename(path))[0], fmt, im.convert("RGB"), im.size


def _encode(image, fmt: str, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    if fmt == "jpeg":
        image.save(buffer, "JPEG", quality=quality)
    else:
        image.save(buffer, "PNG")
    return buffer.getvalue()


def _flat(image) -> bool:
    return float(np.asarray(image.convert("L"), dtype=np.float32).std()) < FLAT_STD


def _write(root: str, label: str, name: str, data: bytes) -> str:
    os.makedirs(os.path.join(root, label), exist_ok=True)
    with open(os.path.join(root, label, name), "wb") as f:
        f.write(data)
    return f"{label}/{name}"


def _variant(image, kind: str, fmt: str, edge: str) -> tuple[bytes, str]:
    """(bytes, format) of one variant of a source crop."""
    from PIL import Image, ImageEnhance

    w, h = image.size
    if kind == "half":
        return _encode(image.resize((w // 2, h // 2), Image.LANCZOS), fmt), fmt
    if kind == "double":
        return _encode(image.resize((w * 2, h * 2), Image.LANCZOS), fmt), fmt
    if kind == "q60":
        return _encode(image, "jpeg", 60), "jpeg"
    if kind == "cut5":
        dx, dy = round(w * 0.05), round(h * 0.05)
        box = {
            "left": (dx, 0, w, h),
            "right": (0, 0, w - dx, h),
            "top": (0, dy, w, h),
            "bottom": (0, 0, w, h - dy),
        }[edge]
        return _encode(image.crop(box), fmt), fmt
    if kind == "bright":
        return _encode(ImageEnhance.Brightness(image).enhance(1.1), fmt), fmt
    if kind == "other_format":
        other = "png" if fmt == "jpeg" else "jpeg"
        return _encode(image, other), other
    raise ValueError(kind)


def make_corpus(sample: float) -> tuple[str, dict]:
    """The precision/recall corpus: (its image folder, {key: [source id, kind, wallpaper,
    the edge cut5 cut]}); cached."""
    from PIL import Image

    root = os.path.join(WORK, f"near_corpus_{sample:g}")
    truth_file = os.path.join(root, "truth.json")
    if os.path.exists(truth_file):
        with open(truth_file) as f:
            return os.path.join(root, "images"), json.load(f)
    shutil.rmtree(root, ignore_errors=True)
    images = os.path.join(root, "images")
    rng = np.random.default_rng(0)
    paths = wallpapers()
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    truth: dict[str, list] = {}
    flat = 0
    sampled = 0
    cw, ch = CROP
    for path in paths:
        name, fmt, big, _ = _open(path)
        image = big.resize(
            (WIDTH, round(big.height * WIDTH / big.width)), Image.LANCZOS, reducing_gap=3.0
        )
        ext = "jpg" if fmt == "jpeg" else "png"
        cols, rows = image.width // cw, image.height // ch
        for r in range(rows):
            for c in range(cols):
                crop = image.crop((c * cw, r * ch, (c + 1) * cw, (r + 1) * ch))
                if _flat(crop):
                    flat += 1
                    continue
                sid = f"{name}_r{r}c{c}"
                key = _write(images, name, f"{sid}.{ext}", _encode(crop, fmt))
                truth[key] = [sid, "source", name, ""]
                if rng.random() >= sample:
                    continue
                edge = EDGES[sampled % len(EDGES)]
                sampled += 1
                others = [n for n in names if n != name]
                for kind in VARIANTS:
                    label = name
                    if kind == "copy" or rng.random() < OTHER_LABEL:
                        label = others[int(rng.integers(len(others)))]
                    if kind == "copy":
                        data, vfmt = _encode(crop, fmt), fmt
                    else:
                        data, vfmt = _variant(crop, kind, fmt, edge)
                    vext = "jpg" if vfmt == "jpeg" else "png"
                    key = _write(images, label, f"{sid}_{kind}.{vext}", data)
                    truth[key] = [sid, kind, name, edge if kind == "cut5" else ""]
        ox, oy = round(OFFSET[0] * cw), round(OFFSET[1] * ch)
        for r in range(rows - 1):
            for c in range(cols - 1):
                box = (c * cw + ox, r * ch + oy, (c + 1) * cw + ox, (r + 1) * ch + oy)
                crop = image.crop(box)
                if _flat(crop):
                    flat += 1
                    continue
                sid = f"{name}_o{r}c{c}"
                key = _write(images, name, f"{sid}.{ext}", _encode(crop, fmt))
                truth[key] = [sid, "offset", name, ""]
    with open(os.path.join(root, "flat.json"), "w") as f:
        json.dump({"flat_skipped": flat}, f)
    with open(truth_file, "w") as f:
        json.dump(truth, f, indent=0, sort_keys=True)
    return images, truth


def _small_crops():
    """(wallpaper, format, name, crop) of every small crop that is not flat: each
    wallpaper at each of SCALES cut on grids shifted by each of PHASES, a crop size
    drawn for each grid."""
    from PIL import Image

    rng = np.random.default_rng(1)
    opened = [_open(p) for p in wallpapers()]
    for si, scale in enumerate(SCALES):
        scaled = [
            (
                name,
                fmt,
                big.resize(
                    (round(big.width * scale), round(big.height * scale)),
                    Image.LANCZOS,
                    reducing_gap=3.0,
                )
                if scale != 1.0
                else big,
            )
            for name, fmt, big, _ in opened
        ]
        for pi, (px, py) in enumerate(PHASES):
            for name, fmt, image in scaled:
                w = int(rng.integers(SMALL[0], SMALL[1] + 1))
                h = round(w * 3 / 4)
                for y in range(round(py * h), image.height - h + 1, h):
                    for x in range(round(px * w), image.width - w + 1, w):
                        crop = image.crop((x, y, x + w, y + h))
                        if not _flat(crop):
                            yield name, fmt, f"s{si}p{pi}_{y:04d}_{x:04d}", crop


def make_small(n: int) -> str:
    """``n`` small crops (64x48 to 128x96) cut on grids at several scales of the
    wallpapers, one label folder a wallpaper; flat crops skipped; cached. A smaller
    folder is hard links to every k-th file of the largest one made."""

    out = os.path.join(WORK, f"near_small_{n}")
    if os.path.exists(os.path.join(out, ".done")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    bigger = sorted(
        (int(p.rsplit("_", 1)[1]), p)
        for p in glob.glob(os.path.join(WORK, "near_small_*"))
        if os.path.exists(os.path.join(p, ".done")) and int(p.rsplit("_", 1)[1]) > n
    )
    if bigger:
        total, src = bigger[0]
        files = sorted(glob.glob(os.path.join(src, "*", "*")))
        for path in files[:: max(1, total // n)][:n]:
            label = os.path.basename(os.path.dirname(path))
            os.makedirs(os.path.join(out, label), exist_ok=True)
            os.link(path, os.path.join(out, label, os.path.basename(path)))
        open(os.path.join(out, ".done"), "w").close()
        return out
    count = 0
    for name, fmt, tag, crop in _small_crops():
        ext = "jpg" if fmt == "jpeg" else "png"
        _write(out, name, f"{tag}.{ext}", _encode(crop, fmt))
        count += 1
        if count == n:
            break
    else:
        raise RuntimeError(f"the wallpapers give {count} crops, fewer than {n}")
    open(os.path.join(out, ".done"), "w").close()
    return out


# ---------------------------------------------------------------- (1) the curve


def fingerprints(images: str, keys: list[str]) -> list[str]:
    """Each file's fingerprint, as convert's inspection takes it."""
    from schemas.images import inspect_stream

    out = []
    for key in keys:
        path = os.path.join(images, key)
        with open(path, "rb") as f:
            out.append(
                inspect_stream(f, os.path.getsize(path), full=True, max_pixels=2**31, near=True)[4]
            )
    return out


class _UnionFind:
    def __init__(self, n: int):
        self.parent = np.arange(n)

    def find(self, i: int) -> int:
        p = self.parent
        while p[i] != i:
            p[i] = p[p[i]]
            i = p[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)

    def labels(self) -> np.ndarray:
        return np.array([self.find(i) for i in range(len(self.parent))])


def _pairs(sizes) -> int:
    return int(sum(s * (s - 1) // 2 for s in sizes))


def rule_labels(keys: list[str], hexes: list[str]) -> dict[int, np.ndarray]:
    """Each file's cluster at each distance 0..MAX_DISTANCE under the rule convert uses
    (``near.matches``: the hashes within the distance with the weak bits left out, the
    thumbnails alike), joined as convert joins them (``clusters_of``: lightest edge
    first, a cluster bounded at 1 % of the inputs)."""
    from beam_jobs.near import clusters_of
    from schemas import near

    n = len(keys)
    parsed = [near.parse(h) for h in hexes]
    values = near.as_array(hexes)
    thumbs = np.stack([p.thumb for p in parsed])
    quality = np.array([p.quality for p in parsed])
    iu, ju = np.triu_indices(n, 1)
    seen = np.empty(len(iu), dtype=np.int64)  # the thumbnails, for every pair
    for s in range(0, len(iu), 1 << 17):
        a, b = iu[s : s + (1 << 17)], ju[s : s + (1 << 17)]
        seen[s : s + len(a)] = near.thumbs_apart(
            thumbs[a], thumbs[b], quality[a], quality[b], values[a] == values[b]
        )
    alike = np.flatnonzero(seen >= 0)
    iu, ju, seen = iu[alike], ju[alike], seen[alike]
    out = {}
    for dist in range(MAX_DISTANCE + 1):
        weak = np.array([near.weak_bits(p.weak, dist) for p in parsed], dtype=np.uint64)
        bits = np.bitwise_count((values[iu] ^ values[ju]) & ~(weak[iu] | weak[ju]))
        took = np.flatnonzero(bits <= dist)
        edges = {(keys[iu[m]], keys[ju[m]]): int(bits[m]) * 256 + int(seen[m]) for m in took}
        given = {k: None for pair in edges for k in pair}
        table, _ = clusters_of((edges, given, set()), n)
        index = {k: i for i, k in enumerate(keys)}
        out[dist] = np.array([index[table[k][0]] if k in table else i for i, k in enumerate(keys)])
    return out


def curve(keys: list[str], hexes: list[str], truth: dict) -> tuple[list[dict], dict]:
    """(a row of figures for each distance 0..MAX_DISTANCE, what the plot and the
    false-cluster list need): the hash alone (each row), and convert's rule (each
    row's ``rule``: :func:`rule_labels`)."""
    from schemas import near

    values = near.as_array(hexes)
    d = near.distances(values, values)
    n = len(keys)
    source = [truth[k][0] for k in keys]
    kind = [truth[k][1] for k in keys]
    sid_index = {s: i for i, s in enumerate(sorted(set(source)))}
    t = np.array([sid_index[s] for s in source])
    true_pairs = _pairs(np.bincount(t))
    origin = {source[i]: i for i in range(n) if kind[i] == "source"}
    variants = [(i, origin[source[i]]) for i in range(n) if kind[i] in VARIANTS]
    edge = {i: f"cut5_{truth[keys[i]][3]}" for i, _ in variants if kind[i] == "cut5"}
    groups = VARIANTS + tuple(f"cut5_{e}" for e in EDGES)  # cut5 also by its edge
    iu, ju = np.triu_indices(n, 1)
    close = d[iu, ju] <= MAX_DISTANCE
    edges = sorted(zip(d[iu, ju][close].tolist(), iu[close].tolist(), ju[close].tolist()))

    def figures(dist: int, labels: np.ndarray) -> dict:
        _, sizes = np.unique(labels, return_counts=True)
        _, joint = np.unique(labels.astype(np.int64) * n + t, return_counts=True)
        pred_pairs, tp = _pairs(sizes), _pairs(joint)
        caught = Counter(kind[v] for v, s in variants if labels[v] == labels[s])
        per_kind = Counter(kind[v] for v, _ in variants)
        caught_edge = Counter(edge[v] for v, s in variants if v in edge and labels[v] == labels[s])
        per_kind.update(edge.values())
        precision = tp / pred_pairs if pred_pairs else 1.0
        recall = tp / true_pairs
        clusters = sizes[sizes > 1]
        mixed = {int(c) for c in np.unique(labels) if len(set(t[labels == c])) > 1}
        return {
            "distance": dist,
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(2 * precision * recall / (precision + recall), 4)
            if precision + recall
            else 0.0,
            "variant_recall": round(sum(caught.values()) / len(variants), 4),
            "variant_recall_by_kind": {
                k: round((caught[k] + caught_edge[k]) / per_kind[k], 3)
                for k in groups
                if per_kind[k]
            },
            "clusters": int(len(clusters)),
            "largest_cluster": int(sizes.max()),
            "false_clusters": len(mixed),
            "false_pairs": pred_pairs - tp,
        }

    uf, e, rows = _UnionFind(n), 0, []
    labels_at = {}
    rule_at = rule_labels(keys, hexes)
    for dist in range(MAX_DISTANCE + 1):
        while e < len(edges) and edges[e][0] <= dist:
            uf.union(edges[e][1], edges[e][2])
            e += 1
        labels = uf.labels()
        labels_at[dist] = labels
        rows.append({**figures(dist, labels), "rule": figures(dist, rule_at[dist])})
    same = t[iu] == t[ju]
    wall = np.array([truth[k][2] for k in keys])
    same_wall = wall[iu] == wall[ju]
    extra = {
        "labels_at": labels_at,
        "true_distances": d[iu, ju][same],
        "variant_distances": {
            k: [int(d[v, s]) for v, s in variants if k in (kind[v], edge.get(v))] for k in groups
        },
        "negative_distances_same_wallpaper": d[iu, ju][~same & same_wall],
        "negative_distances_other_wallpaper": d[iu, ju][~same & ~same_wall],
        "d": d,
        "t": t,
    }
    return rows, extra


def false_clusters(images, keys, truth, labels, t, d, limit: int = 8) -> list[dict]:
    """The clusters joining two or more source crops at one distance: their sources,
    the closest pair across two sources and its images' grayscale deviation."""
    from PIL import Image

    def std(key: str) -> float:
        with Image.open(os.path.join(images, key)) as im:
            return round(float(np.asarray(im.convert("L"), dtype=np.float32).std()), 1)

    out = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(set(t[members])) < 2:
            continue
        best = None
        for a in members:
            for b in members:
                if t[a] < t[b] and (best is None or d[a, b] < best[0]):
                    best = (int(d[a, b]), keys[a], keys[b])
        out.append(
            {
                "size": len(members),
                "sources": sorted({truth[keys[m]][0] for m in members}),
                "closest_across": list(best),
                "std": [std(best[1]), std(best[2])],
            }
        )
    out.sort(key=lambda x: (x["closest_across"][0], -x["size"]))
    return out[:limit]


def clusters(values: np.ndarray, distance: int) -> tuple[np.ndarray, dict]:
    """The connected components of fingerprints within ``distance`` bits, found as
    convert finds them (pairs within each band value's bucket): (each one's cluster,
    the pairs compared and found in the buckets, the largest bucket)."""
    from schemas import near

    unique, inverse = np.unique(values, return_inverse=True)
    uf = _UnionFind(len(unique))
    work = {"pairs_compared": 0, "pairs_found": 0, "largest_bucket": 0}
    for band in near.band_values(unique, distance):
        order = np.argsort(band, kind="stable")
        for members in np.split(order, np.flatnonzero(np.diff(band[order])) + 1):
            m = len(members)
            work["pairs_compared"] += m * (m - 1) // 2
            work["largest_bucket"] = max(work["largest_bucket"], m)
            if m > 1:
                for a, b, _ in near.close_pairs(unique[members], distance):
                    uf.union(int(members[a]), int(members[b]))
                    work["pairs_found"] += 1
    return uf.labels()[inverse], work


def recommend(rows: list[dict]) -> dict:
    best_f1 = max(rows, key=lambda r: (r["f1"], -r["distance"]))
    reaching = [r for r in rows if r["recall"] >= 0.95]
    best_precision = max(reaching, key=lambda r: (r["precision"], -r["distance"]))
    return {"best_f1": best_f1["distance"], "best_precision_recall_95": best_precision["distance"]}


def plot(rows: list[dict], extra: dict, chosen: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schemas import near

    dist = [r["distance"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    for name, style in (
        ("precision", "-o"),
        ("recall", "-s"),
        ("f1", "-^"),
        ("variant_recall", "--"),
    ):
        left.plot(dist, [r[name] for r in rows], style, markersize=3, label=name)
    left.axvline(near.DEFAULT_DISTANCE, color="gray", lw=1, ls=":", label="default now")
    left.axvline(chosen["best_f1"], color="black", lw=1, ls="--", label="best F1")
    left.set_xlabel("--near_distance (bits)")
    left.set_ylim(0, 1.02)
    left.set_xticks(range(0, MAX_DISTANCE + 1, 2))
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    left.set_title("pairwise precision / recall of the clusters")
    bins = np.arange(-1, 66, 2)  # fingerprints have 32 bits set: distances are even
    for data, label in (
        (extra["true_distances"], "same source crop"),
        (extra["negative_distances_same_wallpaper"], "other crop, same wallpaper"),
        (extra["negative_distances_other_wallpaper"], "other wallpaper"),
    ):
        right.hist(data, bins=bins, histtype="step", label=label, density=True)
    right.axvline(near.DEFAULT_DISTANCE + 1, color="gray", lw=1, ls=":")
    right.set_yscale("log")
    right.set_xlabel("bits that differ between two fingerprints")
    right.set_ylabel("fraction of pairs")
    right.legend(fontsize=8)
    right.set_title("distances between pairs")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


# ---------------------------------------------------------------- (2) leakage


def convert(src: str, out: str, *flags: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [
            os.path.join(BIN, "evenshard"),
            "convert",
            f"--input={src}",
            f"--output_dir={out}",
            *flags,
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def split_of(out: str) -> dict[str, str]:
    """{key: split} from the shards' records."""
    import schemas
    from schemas import features, layout
    from schemas.example import parse_example
    from schemas.tfrecord import iter_records

    info = schemas.load_info(out)
    where = {}
    for split, s in info["splits"].items():
        for shard in s["shards"]:
            for record in iter_records(layout.join(out, shard["file"])):
                key = parse_example(record)[features.KEY]
                where[key.decode() if isinstance(key, bytes) else key] = split
    return where


def sidecars(out: str) -> dict[str, str]:
    """{key: fingerprint} from the shards' ``.near`` files."""
    import schemas
    from schemas import layout, near

    info = schemas.load_info(out)
    found = {}
    for s in info["splits"].values():
        for shard in s["shards"]:
            with open(layout.join(out, shard["near"]), "rb") as f:
                found.update(near.parse_sidecar(f.read()))
    return found


def leaks(where: dict[str, str], truth: dict, digest: dict[str, str], held: str) -> dict:
    """Images of split ``held`` with a true near-duplicate, or a byte-identical copy, in
    train."""
    train_sources = {truth[k][0] for k, s in where.items() if s == "train"}
    train_digests = {digest[k] for k, s in where.items() if s == "train"}
    held_keys = [k for k, s in where.items() if s == held]
    leaking = [k for k in held_keys if truth[k][0] in train_sources]
    return {
        "images": len(held_keys),
        "near_duplicate_in_train": len(leaking),
        "identical_copy_in_train": sum(digest[k] in train_digests for k in held_keys),
        "leaking_sources": len({truth[k][0] for k in leaking}),
        "leaking_kinds": dict(Counter(truth[k][1] for k in leaking).most_common()),
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
                busy = 0.0 if SMOKE else _quiet()
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
        "negative_distances": negative_summary,
        "false_clusters": at,
        "png": os.path.relpath(png, HERE),
        "fingerprints_unlike_convert": mismatched,
        "leak_convert_near_duplicates": near_info,
        "leakage": leakage,
        "scale": scale,
        "scale_from": scale_from,
        "repeats": a.repeats,
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
    return old["scale"], old.get("scale_from") or when


# ---------------------------------------------------------------- render


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""
    text = __doc__.split(chr(10), 1)[1].split("    .venv")[0].strip()
    c = r["corpus"]
    rows = table_rows(
        ((row["distance"], row) for row in r["curve"]),
        lambda dist, v: [
            f"**{dist}**" if dist in r["recommended"].values() else str(dist),
            f"{v['precision']:.3f}",
            f"{v['recall']:.3f}",
            f"{v['f1']:.3f}",
            f"{v['variant_recall']:.3f}",
            f"{v['clusters']:,}",
            f"{v['largest_cluster']}",
            f"{v['false_clusters']}",
            *(
                [
                    f"{v['rule']['precision']:.3f}",
                    f"{v['rule']['recall']:.3f}",
                    f"{v['rule']['variant_recall']:.3f}",
                ]
                if "rule" in v
                else ["", "", ""]
            ),
        ],
    )
    default = r["default_distance"]
    by_kind = r["curve"][default]["variant_recall_by_kind"]
    rule = r["curve"][default].get("rule", {})
    rule_by_kind = rule.get("variant_recall_by_kind", {})
    kinds = table_rows(
        r["variant_distances"].items(),
        lambda k, v: [
            k,
            f"{v['median']:g}",
            f"{v['p95']:g}",
            str(v["max"]),
            f"{by_kind.get(k, 0):.3f}",
            f"{rule_by_kind.get(k, 0):.3f}",
        ],
    )
    negatives = table_rows(
        r["negative_distances"].items(),
        lambda k, v: [
            k.replace("_", " "),
            f"{v['pairs']:,}",
            str(v["min"]),
            f"{v['median']:g}",
            f"{v['within_10']:,}",
            f"{v['within_14']:,}",
        ],
    )
    best, precise = r["recommended"]["best_f1"], r["recommended"]["best_precision_recall_95"]
    leak_rows = []
    for run, name in (
        ("plain", "default flags"),
        ("near", f"`--dedupe near` (distance {default})"),
    ):
        for held in ("val", "test"):
            v = r["leakage"][run][held]
            leak_rows.append(
                f"| {name} | {held} | {v['images']:,} | {v['near_duplicate_in_train']:,} "
                f"({v['leaking_sources']} sources) | {v['identical_copy_in_train']:,} |"
            )
    still = Counter()
    for held in ("val", "test"):
        still.update(r["leakage"]["near"][held]["leaking_kinds"])
    still_text = ", ".join(f"{k} {c}" for k, c in still.most_common())
    false = []
    for dist, found in r["false_clusters"].items():
        for x in found:
            bits, one, two = x["closest_across"]
            std = " / ".join(f"{v:.0f}" for v in x["std"])
            false.append(
                f"| {dist} | {x['size']} | {len(x['sources'])} | `{one}` – `{two}` | {bits} "
                f"| {std} |"
            )
    if best == precise:
        pick = f"Both rules give {best}: the recommended default."
    else:
        pick = (
            f"Recommended: {precise}, the rule that puts recall first (a missed pair "
            "is a leak; a false pair only keeps two images in one split)."
        )
    out = f"""## near-duplicates on real photos — `benchmarks/near_bench.py`

{text}

The corpus: {c["files"]:,} files from {c["wallpapers"]} wallpapers: {c["sources"]} source
crops, {c["sources_with_variants"]} of them with 7 variants ({c["variants"]:,} variants,
{c["in_another_label"]} in another label folder), {c["offset_crops"]} offset crops;
{c["flat_skipped"]} flat crops skipped. Convert's `.near` fingerprints differ from the
bench's on {r["fingerprints_unlike_convert"]} files.

| distance | precision | recall | F1 | variant recall | clusters | largest | clusters joining 2+ sources | rule: precision | rule: recall | rule: variant recall |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{rows}

The first seven columns: the 64-bit hash alone, its connected components (the
rule before issue 46). The last three: the rule `--dedupe near` uses now
(`schemas.near.matches`: the hash with its weak bits left out, the 8x8 gray
thumbnails and 2x2 colours alike, the quality gate), its pairs joined as convert
joins them (`beam_jobs.near.clusters_of`: lightest edge first, a cluster bounded
at 1 % of the inputs). At the default distance ({default}) the rule's variant
recall is **{rule.get("variant_recall", 0):.3f}** (aim ≥ 0.95 —
{verdict(rule.get("variant_recall", 0), 0.95, below=False)}), precision
{rule.get("precision", 0):.3f} with {rule.get("false_pairs", 0):,} false pairs; the
hash alone: {r["curve"][default]["variant_recall"]:.3f}, {r["curve"][default]["precision"]:.3f},
{r["curve"][default]["false_pairs"]:,}. The weak bits left out bring pairs in at
fewer bits (the rule at 4 bits comes near the hash at 8), and its recall stops
rising from about 6 bits: what it misses there is the quality gate's (smooth crops
whose mean step between neighbouring pixels is under one gray level match only an
identical thumbnail: on 2026-11-26, 24 of the 25 resized, re-encoded or brightened
variants that do not match their source).

![precision and recall against the distance]({r["png"]})

Bits between each variant and its source, and the variants caught at the
default distance ({default}):

| variant | median | 95th percentile | max | in its source's cluster at {default}: hash alone | convert's rule |
|---|---:|---:|---:|---:|---:|
{kinds}

Bits between crops of two different sources (the hard negatives):

| pairs | count | min | median | within 10 bits | within 14 bits |
|---|---:|---:|---:|---:|---:|
{negatives}

Every fingerprint has exactly 32 of its 64 bits set (the coefficients above
their median), so two fingerprints differ in an even number of bits: an odd
distance finds what the even one below it finds (the rows come in equal pairs).
The best precision with recall ≥ 0.95 is at distance **{precise}** (precision
{r["curve"][precise]["precision"]:.3f}, recall {r["curve"][precise]["recall"]:.3f}); the highest F1 at
**{best}** (F1 {r["curve"][best]["f1"]:.3f}). {pick}

Clusters joining two or more source crops (the closest pair across sources,
and the grayscale standard deviation of each of its two images: the false
pairs are smooth gradients, whatever their colours):

| distance | cluster size | sources | closest pair | bits | std |
|---:|---:|---:|---|---:|---:|
{chr(10).join(false)}

Leakage: the same corpus converted with the default splits (train 0.8, val
0.1, test 0.1):

| convert | held-out split | images | with a true near-duplicate in train | with a byte-identical copy in train |
|---|---|---:|---:|---:|
{chr(10).join(leak_rows)}

The held-out images that still have a near-duplicate in train after `--dedupe
near`, by what they are: {still_text or "none"}. Each is a source crop whose
files did not all fall in one cluster (a variant beyond {default} bits of the
others: the recall above).
"""
    if r["scale"]:
        scale = table_rows(
            r["scale"].items(),
            lambda n, v: [
                f"{int(n):,}",
                f"{v['plain']['seconds']:.1f}",
                f"{v['near']['seconds']:.1f}",
                f"**{v['time_ratio']:.2f}** (≤ 1.3 — {verdict(v['time_ratio'], 1.3)})",
                f"{v['plain']['cpu_seconds']:.1f}",
                f"{v['near']['cpu_seconds']:.1f}",
                f"{v['cpu_ratio']:.2f}",
                f"{v['plain']['peak_rss_mb']:,}",
                f"{v['near']['peak_rss_mb']:,}",
                f"{v['rss_ratio']:.2f}",
            ],
        )
        found = table_rows(
            r["scale"].items(),
            lambda n, v: [
                f"{int(n):,}",
                f"{v['near']['near_duplicates']['clusters']:,}",
                f"{v['near']['near_duplicates']['inputs_in_clusters']:,}",
                f"{v['near']['largest_cluster']:,} "
                f"({100 * v['near']['largest_cluster'] / int(n):.0f}%)",
                " / ".join(f"{v['plain']['examples'].get(k, 0):,}" for k in SPLITS),
                " / ".join(f"{v['near']['examples'].get(k, 0):,}" for k in SPLITS),
                f"{v['near']['buckets']['pairs_compared'] / 1e6:,.0f} M",
                f"{v['near']['buckets']['pairs_found']:,}",
                f"{v['near']['buckets']['largest_bucket']:,}",
            ],
        )
        big_n, big = max(((int(n), v) for n, v in r["scale"].items()), key=lambda x: x[0])
        largest = big["near"]["largest_cluster"]
        growth = ""
        if len(r["scale"]) > 1:
            (n1, a), (n2, b) = sorted((int(n), v) for n, v in r["scale"].items())[
                :: len(r["scale"]) - 1
            ]
            per = {
                name: (b[name]["peak_rss_mb"] - a[name]["peak_rss_mb"]) * 1e3 / (n2 - n1)
                for name in ("plain", "near")
            }
            growth = (
                f"Peak RSS grows {per['plain']:.2f} KB an input from {n1:,} to {n2:,} inputs "
                f"without `--dedupe near`, {per['near']:.2f} KB with it (the local runner "
                "keeps every PCollection until the job ends: see the scale section)."
            )
        if r.get("scale_from"):
            old = r["scale_from"]
            out += f"""
Scale was not rerun with this run: the figures below are those measured
{old["date"]} at commit {old["commit"]} (`{old["command"]}`), before issue 46's
rule (the largest cluster and bucket counts are the hash alone's).
"""
        out += f"""
Scale: small crops of the wallpapers (convert's defaults; the default runner,
every core), the best of {(r.get("scale_from") or r).get("repeats", 1)} run(s) of each, round-robin:

| inputs | plain (s) | `--dedupe near` (s) | near / plain | plain CPU (s) | near CPU (s) | CPU near / plain | plain peak RSS (MB) | near peak RSS (MB) | RSS near / plain |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{scale}

{growth} Each run waits (up to 5 minutes) until other work keeps under a
quarter of the cores busy: the machine is shared. The share busy in the 3 s
before each kept run: at most
{max(v[k]["busy_before"] for v in r["scale"].values() for k in ("plain", "near")):.2f}.

What `--dedupe near` found there (distance {default}), the examples a split
(train / val / test) without and with it, and the pair checks in the band
buckets (pairs compared, pairs within {default} bits, the largest bucket; counted
by the bench on the output's `.near` files, as convert buckets them):

| inputs | clusters | inputs in clusters | largest cluster | plain splits | near splits | pairs compared | pairs found | largest bucket |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{found}

A cluster is a connected component: images each within {default} bits of the
next join one cluster though its ends differ in many more. Small crops of
simple content (the low-poly artworks' two-tone crops, a straight edge between
two smooth areas, and gradients; not flat: their grayscale deviation is that of
the other crops) crowd one region of the fingerprints and chain: at
{big_n:,} inputs one cluster holds {largest:,} ({100 * largest / big_n:.0f}%), all in one split, so the
splits' sizes move far from their fractions. The pairs within {default} bits grow
with the square of the inputs in such a dense region, and so does convert's
work on them.
"""
    return out


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
