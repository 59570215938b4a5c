"""The photo corpora of ``near_bench.py``: Debian's wallpapers, the precision/recall
corpus (source crops, their seven variants, offset crops) and the small crops of
the scale runs. Cached under benchmarks/_work/."""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import subprocess

import numpy as np
from _common import SMOKE, WORK, tiny

PACKAGE = "plasma-workspace-wallpapers"
EXTRACTED = "/tmp/photos/x/usr/share/wallpapers"  # an extracted copy, used when present
WALLPAPERS = os.path.join(WORK, "wallpapers")
WIDTH = tiny(1280, 640)  # each wallpaper downscaled to this width: 1/2 to 1/4
CROP = (320, 240)
OFFSET = (0.6, 0.5)  # offset crops: this fraction of a crop right and down from a grid crop
FLAT_STD = 8.0  # grayscale standard deviation under which a crop is flat and skipped
VARIANTS = ("half", "double", "q60", "cut5", "bright", "other_format", "copy")
EDGES = ("left", "right", "top", "bottom")
OTHER_LABEL = 0.25  # the chance a variant (not the copy: always) goes to another label
SMALL = (64, 128)  # width range of the scale corpus's crops (4:3)
SCALES = (1.0, 0.85, 0.7, 0.6, 0.5, 0.35, 0.25)  # the scale corpus: each wallpaper at these scales,
PHASES = ((0, 0), (0.5, 0.5), (0.5, 0), (0, 0.5))  # cut on grids shifted by these fractions


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
