"""reader/pixels.py decodes a PNG (through libpng, OpenCV) to Pillow's pixels at 1, 3
and 4 channels: every colour type, bit depth, tRNS and interlace; a PNG it cannot
decode fails as Pillow fails."""

from __future__ import annotations

import io

import numpy as np
import pytest
from image_matrix import build
from PIL import Image

from reader import pixels
from reader.pydecode import eight_bit_png

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
