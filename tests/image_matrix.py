"""Images of every format x mode x quirk the readers must agree on, with a reference decode.

``build(root)`` writes one file a case under ``root/<format>/`` (the label is
the format) and returns {key: Case}. Every image is H x W, so a reader asked
for ``image_size=(H, W)`` resizes nothing and its pixels can be compared with
``Case.reference`` (uint8 RGB): the rule of docs/convert.md#decoding, computed
here with numpy from the pixels a lossless file was made from, and for a lossy
one Pillow's decode (libjpeg's accurate IDCT, libwebp).
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from typing import NamedTuple

import numpy as np
from PIL import Image

H, W = 12, 10


class Case(NamedTuple):
    data: bytes
    channels: int  # what TensorFlow's decoder gives with channels=0
    reference: np.ndarray  # uint8 [H, W, 3]: the RGB every reader must give
    lossy: bool  # JPEG, lossy WebP: compared within the IDCT's rounding


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def _png(arr: np.ndarray, color_type: int, depth: int, extra: bytes = b"", palette=None) -> bytes:
    """A PNG written chunk by chunk (Pillow cannot write 16-bit LA or RGB)."""
    h, w = arr.shape[:2]
    dtype = ">u2" if depth == 16 else np.uint8
    raw = b"".join(b"\0" + arr[y].astype(dtype).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    plte = chunk(b"PLTE", palette) if palette is not None else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + extra
        + plte
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=2).astype(np.uint8)


def build(root: str) -> dict[str, Case]:
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (H, W), dtype=np.uint8)
    gray = rng.integers(0, 256, (H, W), dtype=np.uint8)
    g16 = rng.integers(0, 65536, (H, W), dtype=np.uint16)
    rgb16 = rng.integers(0, 65536, (H, W, 3), dtype=np.uint16)
    # 16 bits to 8: libpng's strip (the high byte), what every decoder here gives
    hi = (g16 >> 8).astype(np.uint8)
    rgb_hi = (rgb16 >> 8).astype(np.uint8)
    smooth = np.stack(
        [*np.meshgrid(np.linspace(0, 255, W), np.linspace(0, 255, H))[::-1]]
        + [np.full((H, W), 128.0)],
        axis=2,
    ).astype(np.uint8)  # JPEG-friendly: small IDCT differences only
    palette_rgb = rng.integers(0, 256, (16, 3), dtype=np.uint8)
    index = rng.integers(0, 16, (H, W), dtype=np.uint8)
    pal_im = Image.fromarray(index, "P")
    pal_im.putpalette(palette_rgb.tobytes())
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: "rotate 90 degrees to show": decoders must not
    gama = struct.pack(">I", 4) + b"gAMA" + struct.pack(">I", 100000)
    gama += struct.pack(">I", zlib.crc32(gama[4:]))
    bits = (gray > 127).astype(np.uint8)
    cmyk = Image.fromarray(smooth, "RGB").convert("CMYK")
    cases = {
        "png/gray.png": Case(
            _save(Image.fromarray(gray, "L"), "PNG"), 1, _gray_to_rgb(gray), False
        ),
        "png/bilevel.png": Case(
            _save(Image.fromarray(bits * 255, "L").convert("1"), "PNG"),
            1,
            _gray_to_rgb(bits * 255),
            False,
        ),
        "png/gray_alpha.png": Case(
            _save(Image.fromarray(np.stack([gray, alpha], 2), "LA"), "PNG"),
            2,
            _gray_to_rgb(gray),
            False,
        ),
        "png/rgb.png": Case(_save(Image.fromarray(rgb, "RGB"), "PNG"), 3, rgb, False),
        "png/rgba.png": Case(
            _save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "PNG"), 4, rgb, False
        ),
        "png/palette.png": Case(_save(pal_im, "PNG"), 3, palette_rgb[index], False),
        "png/palette_trns.png": Case(
            _save(pal_im, "PNG", transparency=3), 4, palette_rgb[index], False
        ),
        "png/gray_trns.png": Case(
            _save(Image.fromarray(gray, "L"), "PNG", transparency=5), 1, _gray_to_rgb(gray), False
        ),
        "png/interlaced.png": Case(
            _save(Image.fromarray(rgb, "RGB"), "PNG", interlace=1), 3, rgb, False
        ),
        "png/gamma.png": Case(_png(rgb, 2, 8, extra=gama), 3, rgb, False),
        "png/gray16.png": Case(_png(g16, 0, 16), 1, _gray_to_rgb(hi), False),
        "png/gray_alpha16.png": Case(
            _png(np.dstack([g16, g16[::-1]]), 4, 16), 2, _gray_to_rgb(hi), False
        ),
        "png/rgb16.png": Case(_png(rgb16, 2, 16), 3, rgb_hi, False),
        "png/rgba16.png": Case(_png(np.dstack([rgb16, g16]), 6, 16), 4, rgb_hi, False),
        "jpeg/rgb.jpg": Case(
            _save(Image.fromarray(smooth, "RGB"), "JPEG", quality=95), 3, smooth, True
        ),
        "jpeg/rgb444.jpg": Case(
            _save(Image.fromarray(smooth, "RGB"), "JPEG", quality=95, subsampling=0),
            3,
            smooth,
            True,
        ),
        "jpeg/progressive.jpg": Case(
            _save(Image.fromarray(smooth, "RGB"), "JPEG", quality=95, progressive=True),
            3,
            smooth,
            True,
        ),
        "jpeg/gray.jpg": Case(
            _save(Image.fromarray(smooth[..., 0], "L"), "JPEG", quality=95),
            1,
            _gray_to_rgb(smooth[..., 0]),
            True,
        ),
        "jpeg/exif_rotated.jpg": Case(
            _save(Image.fromarray(smooth, "RGB"), "JPEG", quality=95, exif=exif.tobytes()),
            3,
            smooth,
            True,
        ),
        "jpeg/cmyk.jpg": Case(_save(cmyk, "JPEG", quality=95), 3, smooth, True),
        "gif/palette.gif": Case(_save(pal_im, "GIF"), 3, palette_rgb[index], False),
        "gif/transparent.gif": Case(
            _save(pal_im, "GIF", transparency=3),
            3,
            np.where((index == 3)[..., None], 0, palette_rgb[index]).astype(np.uint8),
            False,
        ),
        "gif/animated.gif": Case(
            _save(
                pal_im,
                "GIF",
                save_all=True,
                append_images=[Image.fromarray(15 - index, "P")],
                duration=50,
            ),
            3,
            palette_rgb[index],
            False,
        ),
        "bmp/rgb24.bmp": Case(_save(Image.fromarray(rgb, "RGB"), "BMP"), 3, rgb, False),
        "bmp/rgba32.bmp": Case(
            _save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "BMP"), 4, rgb, False
        ),
        "webp/lossless.webp": Case(
            _save(Image.fromarray(rgb, "RGB"), "WEBP", lossless=True), 3, rgb, False
        ),
        "webp/lossless_alpha.webp": Case(
            _save(
                Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "WEBP", lossless=True, exact=True
            ),
            4,
            rgb,
            False,
        ),
        "webp/lossy.webp": Case(
            _save(Image.fromarray(smooth, "RGB"), "WEBP", quality=95), 3, smooth, True
        ),
    }
    for key, case in cases.items():
        if case.lossy:  # the reference decode: libjpeg / libwebp through Pillow
            rgb_decoded = np.asarray(Image.open(io.BytesIO(case.data)).convert("RGB"))
            cases[key] = case = case._replace(reference=rgb_decoded)
        path = os.path.join(root, key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(case.data)
    return cases
