"""reader/decode/pixels.py decodes a PNG (through libpng, OpenCV) to Pillow's pixels at 1, 3
and 4 channels: every colour type, bit depth, tRNS and interlace; a PNG it cannot
decode fails as Pillow fails."""

from __future__ import annotations

import io

import numpy as np
import pytest
from image_matrix import build
from PIL import Image

from reader.decode import pixels
from reader.decode.pydecode import eight_bit_png

pytestmark = pytest.mark.fast


def _pillow(data: bytes, channels: int) -> np.ndarray:
    with Image.open(io.BytesIO(eight_bit_png(data))) as im:
        out = np.asarray(im.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels]))
    return out[..., None] if channels == 1 else out


def _save(im: Image.Image, **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, "PNG", **kw)
    return out.getvalue()


def _pngs(root) -> dict[str, bytes]:
    cases = {k: c.data for k, c in build(str(root)).items() if k.startswith("png/")}
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (21, 17, 3), dtype=np.uint8))
    rgba = np.dstack([np.asarray(rgb), rng.integers(0, 256, (21, 17), dtype=np.uint8)])
    palette_alpha = Image.fromarray(rgba, "RGBA").quantize(16, method=Image.Quantize.FASTOCTREE)
    return {
        **cases,
        "1-bit": _save(rgb.convert("1")),
        "4-bit palette": _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), bits=4),
        "palette, partial alpha": _save(palette_alpha),
        "gray, tRNS": _save(rgb.convert("L"), transparency=7),
        "rgb, tRNS": _save(rgb, transparency=tuple(int(v) for v in np.asarray(rgb)[0, 0])),
        "rgba, interlaced": _save(Image.fromarray(rgba, "RGBA"), interlace=1),
        "la": _save(Image.fromarray(rgba[..., [0, 3]], "LA")),
    }


def test_every_png_decodes_to_pillows_pixels_at_1_3_and_4_channels(tmp_path):
    wrong = []
    for name, data in _pngs(tmp_path).items():
        for channels in (1, 3, 4):
            got, want = pixels.decode(data, channels), _pillow(data, channels)
            if got.shape != want.shape or not np.array_equal(got, want):
                wrong.append((name, channels))
    assert not wrong


def test_a_png_libpng_refuses_fails_as_pillow_fails():
    data = _save(Image.new("RGB", (30, 30), (9, 80, 200)))
    at = data.index(b"IDAT") + 8
    broken = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]  # a bad zlib stream
    with pytest.raises(Exception) as pillow:
        _pillow(broken, 3)
    with pytest.raises(type(pillow.value), match=str(pillow.value)):
        pixels.decode(broken, 3)


def _chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png16(samples: np.ndarray, color_type: int, transparent: np.ndarray) -> bytes:
    """A 16-bit PNG of ``samples`` (H, W[, 3]) whose tRNS names ``transparent``."""
    import struct
    import zlib

    height, width = samples.shape[:2]
    rows = samples.reshape(height, -1).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in rows)
    head = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", head)
        + _chunk(b"tRNS", np.asarray(transparent).astype(">u2").tobytes())
        + _chunk(b"IDAT", zlib.compress(raw))
        + _chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("color_type", [0, 2])
def test_a_16_bit_png_with_trns_is_tensorflows_on_both_routes(color_type):
    """tRNS names one 16-bit sample value transparent: TensorFlow's alpha is 0 on exactly
    the pixels of that value (not on those sharing its high byte); the tf.data route
    (pixels.decode) and the Python route (parse's eight_bit_png, then pixels.decode)
    give its pixels (was: alpha 255 everywhere, gray on both, RGB on the Python
    route)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    shape = (6, 7) if color_type == 0 else (6, 7, 3)
    samples = rng.integers(0, 65536, shape, dtype=np.uint16)
    transparent = samples[2, 3].copy()
    samples[0, 0] = transparent  # two transparent pixels
    samples[1, 1] = transparent ^ 1  # one sharing its high byte, not transparent
    data = _png16(samples, color_type, transparent)
    for channels in (1, 3, 4):
        if channels == 1 and color_type == 2:
            continue  # a colour PNG to gray is Pillow's luma, not TensorFlow's
        want = tf.io.decode_png(data, channels=channels).numpy()
        assert np.array_equal(pixels.decode(data, channels), want), channels
        assert np.array_equal(pixels.decode(eight_bit_png(data), channels), want), channels
