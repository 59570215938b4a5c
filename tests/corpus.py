"""The bad-input corpus: one of each odd file a real photo collection holds.

``build_folder(root)`` writes the files (Pillow and plain writes) and returns
{key: expectation}, where an expectation is ``("reject", reason)`` or
``("accept", format, height, width, channels)``. ``build_manifest`` adds a
CSV (BOM, CRLF) with the manifest-level cases.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
from PIL import Image


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def _rgb(h: int, w: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB")


def bomb_png(width: int, height: int) -> bytes:
    """A valid small PNG whose header claims width x height (a decompression bomb)."""
    png = _save(_rgb(8, 8), "PNG")
    ihdr = bytearray(png[8:33])  # length, b"IHDR", 13 data bytes, CRC
    ihdr[8:16] = struct.pack(">II", width, height)
    ihdr[21:25] = struct.pack(">I", zlib.crc32(bytes(ihdr[4:21])))
    return png[:8] + bytes(ihdr) + png[33:]


def build_folder(root: str) -> dict[str, tuple]:
    os.makedirs(os.path.join(root, "odd"), exist_ok=True)
    jpeg = _save(_rgb(40, 30, 1), "JPEG", quality=90)
    png = _save(_rgb(40, 30, 2), "PNG")
    palette = _rgb(20, 24, 3).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 0
    frames = [_rgb(12, 16, s) for s in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees when shown
    gray16 = Image.fromarray((np.arange(18 * 22, dtype=np.uint16).reshape(18, 22) * 150), "I;16")
    files = {
        "odd/truncated.jpg": (jpeg[: len(jpeg) // 2], ("reject", "truncated")),
        "odd/truncated.png": (png[: len(png) // 2], ("reject", "truncated")),
        "odd/zero.jpg": (b"", ("reject", "empty")),
        "odd/text.jpg": (b"just some text\n", ("reject", "unsupported_format")),
        "odd/drawing.svg": (
            b'<svg xmlns="http://www.w3.org/2000/svg"/>',
            ("reject", "unsupported_format"),
        ),
        "odd/bomb.png": (bomb_png(60_000, 60_000), ("reject", "too_large")),
        "odd/cmyk.jpg": (
            _save(_rgb(26, 34, 4).convert("CMYK"), "JPEG"),
            ("accept", "jpeg", 26, 34, 3),
        ),
        "odd/gray16.png": (_save(gray16, "PNG"), ("accept", "png", 18, 22, 1)),
        "odd/palette_alpha.png": (
            _save(palette, "PNG", transparency=0),
            ("accept", "png", 20, 24, 4),
        ),
        "odd/animated.gif": (gif.getvalue(), ("accept", "gif", 12, 16, 3)),
        "odd/exif_rotated.jpg": (
            _save(_rgb(10, 30, 5), "JPEG", exif=exif.tobytes()),
            ("accept", "jpeg", 10, 30, 3),
        ),
        "odd/plain.png": (png, ("accept", "png", 40, 30, 3)),
    }
    for rel, (data, _) in files.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    expected = {rel: exp for rel, (_, exp) in files.items()}
    # a file name that is not valid UTF-8
    with open(os.path.join(os.fsencode(root), b"odd", b"caf\xe9.jpg"), "wb") as f:
        f.write(jpeg)
    expected["odd/caf\\xe9.jpg"] = ("reject", "bad_path")
    os.symlink("loop.jpg", os.path.join(root, "odd", "loop.jpg"))
    expected["odd/loop.jpg"] = ("reject", "unreadable")
    if os.geteuid() != 0:  # root reads everything: the case cannot exist there
        locked = os.path.join(root, "odd", "locked.jpg")
        with open(locked, "wb") as f:
            f.write(jpeg)
        os.chmod(locked, 0)
        expected["odd/locked.jpg"] = ("reject", "unreadable")
    return expected


def build_manifest(root: str, path: str) -> dict[str, tuple]:
    """A CSV with a BOM and CRLF ends over the folder's good files, plus manifest cases."""
    odd = os.path.relpath(os.path.join(root, "odd"), os.path.dirname(path))
    rows = [
        "path,label,key",
        f"{odd}/plain.png,odd,",
        f"{odd}/cmyk.jpg,odd,",
        "",  # blank: not an input
        f"{odd}/animated.gif,odd,dup",
        f"{odd}/palette_alpha.png,odd,dup",  # duplicate key
        "../outside.png,odd,",  # escapes the root
        f"{odd}/gray16.png,martian,",  # not in --labels
        f"{odd}/exif_rotated.jpg,odd,x,too many",  # malformed
    ]
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        f.write("\r\n".join(rows) + "\r\n")
    return {
        f"{odd}/plain.png": "accept",
        f"{odd}/cmyk.jpg": "accept",
        "dup": "accept",
        "dup ": "duplicate_key",
        "../outside.png": "bad_path",
        f"{odd}/gray16.png": "bad_label",
        "row:9": "malformed_row",
    }
