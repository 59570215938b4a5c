"""The peers corpus for ``peers_bench.py`` (and ``limit_bench.py``, ``gpu_check.py``):
crops of Debian's plasma-workspace-wallpapers photographs in label folders.

Image i of N has label i * LABELS // N (label-sorted, ``label_LLL/img_IIIIII.jpg``);
label l is cut from wallpaper l mod 30, from a vertical strip of its own. Each crop is
a random box (long side CROP of the original, aspect ASPECT, one in five portrait)
resized (Lanczos) to LONG px on the long side and saved as JPEG of quality QUALITY;
cached in benchmarks/_work/.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

import numpy as np
from _common import WORK, tiny

LABELS = tiny(100, 10)  # every label has images: convert numbers the folders it finds
QUALITY = (85, 90)  # JPEG quality, drawn in this range (inclusive)
LONG = tiny(500, 160)  # long side of a saved image
CROP = tiny((420, 760), (120, 240))  # long side of the box cut from the wallpaper
ASPECT = (1.2, 1.5)
PORTRAIT = 0.2


def _label_range(label: int, count: int) -> range:
    """The indices i with i * LABELS // count == label."""
    first = -(-label * count // LABELS)
    return range(first, -(-(label + 1) * count // LABELS))


def _cut(path: str, labels: list[int], count: int, root: str) -> None:
    """The crops of one wallpaper's labels, each label from a vertical strip of its own."""
    from PIL import Image

    with Image.open(path) as im:
        image = im.convert("RGB")
    width, height = image.size
    for strip, label in enumerate(labels):
        rng = np.random.default_rng(label)
        folder = os.path.join(root, f"label_{label:03d}")
        os.makedirs(folder, exist_ok=True)
        left, right = width * strip // len(labels), width * (strip + 1) // len(labels)
        for i in _label_range(label, count):
            aspect = rng.uniform(*ASPECT)
            long = int(rng.integers(CROP[0], CROP[1] + 1))
            box_w, box_h = long, round(long / aspect)
            size = (LONG, round(LONG / aspect))
            if rng.random() < PORTRAIT:
                box_w, box_h, size = box_h, box_w, size[::-1]
            cx = rng.uniform(left, right)
            x = int(np.clip(cx - box_w / 2, 0, width - box_w))
            y = int(rng.integers(0, height - box_h + 1))
            crop = image.crop((x, y, x + box_w, y + box_h)).resize(size, Image.LANCZOS)
            quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
            crop.save(os.path.join(folder, f"img_{i:06d}.jpg"), "JPEG", quality=quality)


def make_corpus(count: int) -> str:
    """``count`` real-photo JPEGs in LABELS label folders, label-sorted; cached."""
    from _near_corpus import wallpapers

    root = os.path.join(WORK, f"peers_photos_{count}")
    if os.path.exists(os.path.join(root, ".done")):
        return root
    shutil.rmtree(root, ignore_errors=True)
    paths = wallpapers()
    tasks = [
        (path, [lab for lab in range(LABELS) if lab % len(paths) == w], count, root)
        for w, path in enumerate(paths)
    ]
    with multiprocessing.Pool(2) as pool:
        pool.starmap(_cut, tasks)
    open(os.path.join(root, ".done"), "w").close()
    return root


def corpus_facts(src: str) -> dict:
    from PIL import Image

    sizes, pixels = [], []
    for d, _, names in os.walk(src):
        for n in names:
            if n.endswith(".jpg"):
                p = os.path.join(d, n)
                sizes.append(os.path.getsize(p))
                with Image.open(p) as im:
                    pixels.append(im.width * im.height)
    return {
        "images": len(sizes),
        "labels": LABELS,
        "mean_kb": round(float(np.mean(sizes)) / 1e3, 1),
        "mean_pixels": round(float(np.mean(pixels))),
        "mb": round(sum(sizes) / 1e6),
    }
