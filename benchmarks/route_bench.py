"""The tf.data route's decode against TensorFlow's own, on small PNGs and on photos.

With an ``image_size``, ``make_dataset`` decodes and resizes a batch in one Python
call (``reader/decode/pixels.py``); before, it decoded and resized each image in
TensorFlow's ops. What a route costs depends on the images: a change of route is
measured here on both kinds, A/B in one process on the same bytes:

(a) ``reader.make_dataset(..., image_size=(64, 64), seed=0)`` over the converted
    dataset (``evenshard convert --splits=train=1.0``, the other flags the defaults);
(b) TensorFlow's own route over the same encoded bytes in memory: ``decode_full``
    (``decode_png``/``decode_jpeg`` with the accurate IDCT) + ``tf.image.resize``,
    rounded, mapped with AUTOTUNE parallel calls, batches of 256.

Corpora: **icons**, the PNG icons of /usr/share/icons 48 to 256 px (each distinct
file once), topped up to ``--icons`` with generated PNGs of the same sizes (shapes
on a flat or transparent ground, RGBA, palette, RGB and gray); **photos**, crops of
a real photo (matplotlib's sample ``grace_hopper.jpg``), 200 to 500 px, JPEG
quality 85 to 90. Round-robin over ``--rounds`` rounds: each round's ratio a / b,
their range, and the best rates. Checked: every pass reads every image once, and
(a)'s pixels are within 2 levels of (b)'s (0.5 mean): the decoders agree, the
resizes are within a level (docs/convert.md#decoding).

    .venv/bin/python benchmarks/route_bench.py [--icons 20000] [--photos 2000] [--rounds 5]
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import WORK, bench_main, convert_once, list_images  # noqa: E402

SIZE = (64, 64)
BATCH = 256
FLAGS = {
    "icons": (int, 20_000, "small PNGs in the icons corpus", 24),
    "photos": (int, 2_000, "photo crops in the photos corpus", 12),
    "rounds": (int, 5, "round-robin rounds of (a) and (b)", 1),
}


def _write(root: str, i: int, data: bytes, ext: str) -> None:
    folder = os.path.join(root, f"label_{i % 10}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"img_{i:06d}.{ext}"), "wb") as f:
        f.write(data)


def _icon(rng: np.random.Generator) -> bytes:
    """A generated icon: a few filled shapes on a flat or transparent ground."""
    from PIL import Image, ImageDraw

    side = int(rng.choice([48, 64, 96, 128, 192, 256]))
    mode = str(rng.choice(["RGBA", "RGBA", "P", "RGB", "L"]))
    ground = (0, 0, 0, 0) if mode == "RGBA" else tuple(int(v) for v in rng.integers(0, 256, 4))
    im = Image.new("RGBA", (side, side), ground)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 7))):
        x0, y0 = (int(v) for v in rng.integers(0, side * 3 // 4, 2))
        x1, y1 = x0 + int(rng.integers(side // 8, side // 2)), y0 + int(rng.integers(4, side // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 4))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    if mode == "P":
        im = im.convert("RGB").quantize(int(rng.choice([16, 64, 256])))
    elif mode != "RGBA":
        im = im.convert(mode)
    out = io.BytesIO()
    im.save(out, "PNG")
    return out.getvalue()


def make_icons(count: int) -> str:
    """``count`` small PNGs: the system's icons 48-256 px, then generated ones; cached."""
    from PIL import Image

    root = os.path.join(WORK, f"route_icons_{count}")
    if os.path.exists(os.path.join(root, ".done")):
        return root
    seen, n = set(), 0
    for path in sorted(glob.glob("/usr/share/icons/**/*.png", recursive=True)):
        if n == count:
            break
        try:
            data = open(path, "rb").read()
            with Image.open(io.BytesIO(data)) as im:
                fits = 48 <= min(im.size) and max(im.size) <= 256
        except (OSError, ValueError):
            continue
        digest = hashlib.sha256(data).digest()
        if fits and digest not in seen:
            seen.add(digest)
            _write(root, n, data, "png")
            n += 1
    rng = np.random.default_rng(0)
    for i in range(n, count):
        _write(root, i, _icon(rng), "png")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".done"), "w") as f:
        f.write(str(n))  # how many are the system's icons
    return root


def make_photos(count: int) -> str:
    """``count`` JPEG crops of a real photo, 200 to 500 px a side; cached."""
    from matplotlib import cbook
    from PIL import Image

    root = os.path.join(WORK, f"route_photos_{count}")
    if os.path.exists(os.path.join(root, ".done")):
        return root
    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as im:
        photo = im.convert("RGB")
    rng = np.random.default_rng(0)
    for i in range(count):
        w, h = (int(v) for v in rng.integers(200, 501, 2))
        bw, bh = int(rng.integers(120, photo.width + 1)), int(rng.integers(120, photo.height + 1))
        x, y = (
            int(rng.integers(0, photo.width - bw + 1)),
            int(rng.integers(0, photo.height - bh + 1)),
        )
        crop = photo.crop((x, y, x + bw, y + bh)).resize((w, h), Image.BILINEAR)
        out = io.BytesIO()
        crop.save(out, "JPEG", quality=int(rng.integers(85, 91)))
        _write(root, i, out.getvalue(), "jpg")
    open(os.path.join(root, ".done"), "w").close()
    return root


def _pass(ds, n: int) -> tuple[float, float, dict]:
    """Images/s of one pass over ``ds``, the CPU µs it took an image (every thread of
    the process: what others' work on the machine moves least), and its images by key
    (the first batch's)."""
    start, cpu, seen, first = time.perf_counter(), time.process_time(), 0, {}
    for batch in ds:
        seen += int(batch["image"].shape[0])
        if not first:
            first = {k.decode(): im for k, im in zip(batch["key"].numpy(), batch["image"].numpy())}
    if seen != n:
        raise RuntimeError(f"read {seen} images, expected {n}")
    cpu_us = (time.process_time() - cpu) / n * 1e6
    return n / (time.perf_counter() - start), cpu_us, first


def _corpus(tf, src: str, name: str, rounds: int) -> dict:
    import reader
    from reader.decode.tf_decode import decode_full

    data_dir = convert_once(src, os.path.join(WORK, f"route_{name}_out"), "--splits=train=1.0")
    files = list_images(src)
    keys = [os.path.relpath(path, src) for path, _ in files]
    encoded = [open(path, "rb").read() for path, _ in files]
    fmts = ["jpeg" if e[:3] == b"\xff\xd8\xff" else "png" for e in encoded]

    def tf_route(key, data, fmt):
        image = tf.image.resize(decode_full(data, fmt, 3), SIZE)
        return {"key": key, "image": tf.saturate_cast(tf.round(image), tf.uint8)}

    routes = {
        "a_make_dataset": reader.make_dataset(data_dir, "train", BATCH, image_size=SIZE, seed=0),
        "b_tf_ops_in_memory": tf.data.Dataset.from_tensor_slices((keys, encoded, fmts))
        .map(tf_route, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE),
    }
    rates: dict[str, list[float]] = {name: [] for name in routes}
    cpu: dict[str, list[float]] = {name: [] for name in routes}
    images: dict[str, dict] = {}
    for _ in range(rounds):
        for route, ds in routes.items():
            rate, cpu_us, first = _pass(ds, len(files))
            rates[route].append(rate)
            cpu[route].append(cpu_us)
            images.setdefault(route, first)
    # (a)'s first batch against (b)'s decode of the same images
    wanted = dict(zip(keys, zip(encoded, fmts)))
    diffs = []
    for key, image in images["a_make_dataset"].items():
        want = tf_route(key, *wanted[key])["image"].numpy()
        diffs.append(np.abs(image.astype(int) - want.astype(int)))
    worst, mean = max(int(d.max()) for d in diffs), float(np.mean([d.mean() for d in diffs]))
    if worst > 2 or mean > 0.5:
        raise RuntimeError(
            f"{name}: make_dataset's pixels off TensorFlow's by {worst} ({mean:.2f})"
        )
    ratios = [a / b for a, b in zip(rates["a_make_dataset"], rates["b_tf_ops_in_memory"])]
    return {
        "images": len(files),
        "pngs": fmts.count("png"),
        "images_per_s": {k: [round(v) for v in r] for k, r in rates.items()},
        "best": {k: round(max(r)) for k, r in rates.items()},
        "a_over_b": [round(r, 2) for r in ratios],
        "cpu_us_per_image": {k: [round(v) for v in c] for k, c in cpu.items()},
        "cpu_a_over_b": round(min(cpu["a_make_dataset"]) / min(cpu["b_tf_ops_in_memory"]), 2),
        "pixels_max_diff": worst,
        "pixels_mean_diff": round(mean, 3),
    }


def measure(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    icons, photos = make_icons(a.icons), make_photos(a.photos)
    with open(os.path.join(icons, ".done")) as f:
        real = int(f.read() or 0)
    return {
        "rounds": a.rounds,
        "icons": _corpus(tf, icons, f"icons_{a.icons}", a.rounds),
        "photos": _corpus(tf, photos, f"photos_{a.photos}", a.rounds),
        "system_icons": real,
    }


def render(r: dict) -> str:
    """This benchmark's section of RESULTS.md, from its results alone."""

    def row(label, c):
        lo, hi = min(c["a_over_b"]), max(c["a_over_b"])
        best, cpu = c["best"], c["cpu_us_per_image"]
        return (
            f"| {label} | {c['images']:,} | {best['a_make_dataset']:,} | "
            f"{best['b_tf_ops_in_memory']:,} | **{lo:.2f}–{hi:.2f}** | "
            f"{min(cpu['a_make_dataset'])} | {min(cpu['b_tf_ops_in_memory'])} | "
            f"**{c['cpu_a_over_b']:.2f}** | {c['pixels_max_diff']} ({c['pixels_mean_diff']:.2f}) |"
        )

    generated = r["icons"]["images"] - r["system_icons"]
    return f"""## the tf.data route on small PNGs and on photos — `benchmarks/route_bench.py`

(a) `make_dataset(..., image_size=(64, 64), seed=0)` against (b) TensorFlow's own
decode + `tf.image.resize` mapped over the same bytes in memory, {r["rounds"]} rounds
round-robin in one process: best images/s, the range of the rounds' a / b, and the
CPU time an image (every thread of the process, the lowest of the rounds: what
others' work on this shared machine moves least). Icons: the distinct PNG icons of
/usr/share/icons 48–256 px ({r["system_icons"]:,}), topped up with {generated:,}
generated PNGs (RGBA, palette, RGB, gray); photos: JPEG crops of a real photo,
200–500 px.

| corpus | images | (a) img/s | (b) img/s | a / b | (a) CPU µs/img | (b) CPU µs/img | CPU a / b | pixels a vs b: max (mean) |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
{row("small PNG icons", r["icons"])}
{row("photo crops (JPEG)", r["photos"])}

The route decodes a PNG through libpng (OpenCV) and a colour JPEG through
libjpeg-turbo (simplejpeg), both with the GIL released; through Pillow a small
PNG had taken 1.4–1.7 times the CPU, most of it Python holding the GIL
(HISTORY.md).
"""


if __name__ == "__main__":
    bench_main(measure, FLAGS, __doc__)
