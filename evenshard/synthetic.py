"""Generated image folders for the demo, the tests and the benchmarks.

Images are small, seeded, and in several formats; ``broken=True`` adds files
that ``convert`` must reject, each with the reason it must give.
"""

from __future__ import annotations

import io
import os

import numpy as np

from schemas.images import EXTENSION


def image_bytes(
    fmt: str, height: int, width: int, rng: np.random.Generator, mode: str = "RGB"
) -> bytes:
    """A seeded image: a colour gradient with noise, encoded as ``fmt``."""
    from PIL import Image

    base = rng.integers(0, 256, size=3)
    ramp = np.linspace(0, 96, width, dtype=np.float32)[None, :, None]
    noise = rng.normal(0, 12, size=(height, width, 3))
    pixels = np.clip(base[None, None, :] + ramp + noise, 0, 255).astype(np.uint8)
    im = Image.fromarray(pixels, "RGB")
    if mode != "RGB":
        im = im.convert(mode)
    out = io.BytesIO()
    im.save(
        out, "JPEG" if fmt == "jpeg" else fmt.upper(), **({"quality": 85} if fmt == "jpeg" else {})
    )
    return out.getvalue()


def photo_bytes(rng: np.random.Generator, height: int, width: int, quality: int = 90) -> bytes:
    """A photo-like JPEG: noise at every scale from 2 to 256 cells across, each octave
    a little weaker than the one above (a photo's falling spectrum), the channels
    correlated, fine grain on top; JPEG at ``quality``. Bytes a pixel near a photo's, so the
    decode costs what a photo's does (a smooth gradient decodes faster)."""
    from PIL import Image

    out = np.zeros((height, width, 3), np.float32)
    for k in range(8):
        cells = 2 ** (k + 1)
        grid = rng.normal(0, 40 / 1.1**k, (cells, cells, 3)).astype(np.float32)
        grid[..., 1:] = 0.6 * grid[..., :1] + 0.4 * grid[..., 1:]
        for c in range(3):
            plane = Image.fromarray(grid[..., c], "F").resize((width, height), Image.BICUBIC)
            out[..., c] += np.asarray(plane)
    out += rng.normal(0, 5, out.shape) + rng.uniform(60, 190, 3)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(out, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def make_image_folder(
    root: str,
    num_labels: int = 5,
    per_label: int = 100,
    formats: tuple[str, ...] = ("jpeg", "png"),
    size: tuple[int, int] = (24, 32),
    seed: int = 0,
    broken: bool = False,
) -> dict[str, str]:
    """Writes ``root/label_k/img_NNNNN.ext`` files; returns {key: expected reject reason}.

    Sizes vary a little around ``size`` (height, width) so records differ in shape.
    """
    rng = np.random.default_rng(seed)
    for k in range(num_labels):
        label_dir = os.path.join(root, f"label_{k}")
        os.makedirs(label_dir, exist_ok=True)
        for i in range(per_label):
            fmt = formats[(k + i) % len(formats)]
            h = size[0] + int(rng.integers(0, 8))
            w = size[1] + int(rng.integers(0, 8))
            with open(os.path.join(label_dir, f"img_{i:05d}{EXTENSION[fmt]}"), "wb") as f:
                f.write(image_bytes(fmt, h, w, rng))
    return write_broken_files(root, rng) if broken else {}


def write_broken_files(root: str, rng: np.random.Generator | None = None) -> dict[str, str]:
    """Adds files that must be rejected; returns {key: reason}."""
    rng = rng or np.random.default_rng(1)
    label_dir = os.path.join(root, "label_0")
    os.makedirs(label_dir, exist_ok=True)
    jpeg = image_bytes("jpeg", 64, 64, rng)
    png = image_bytes("png", 64, 64, rng)
    files = {
        "label_0/broken_truncated.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
        "label_0/broken_truncated.png": (png[: len(png) // 2], "truncated"),
        "label_0/broken_empty.jpg": (b"", "empty"),
        "label_0/broken_text.jpg": (b"this is not an image\n", "unsupported_format"),
        "label_0/notes.txt": (b"a stray file\n", "unsupported_format"),
        "stray_at_root.jpg": (jpeg, "bad_label"),
    }
    for rel, (data, _) in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return {rel: reason for rel, (_, reason) in files.items()}
