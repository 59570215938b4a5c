"""Python decoding: a serialized record to (encoded image, label, key), the images as
the readers decode them (the 16-bit PNG rule); no TensorFlow."""

from __future__ import annotations

import numpy as np

from schemas import features, layout, storage
from schemas.example import parse_example


def parse(data: bytes, kind: str, root: str | None, fields=None) -> tuple:
    """(encoded image as uint8, label, key) of a serialized record; path records read
    their image at ``root``. A record that is no image (kind ``example``) is itself,
    its label id and key those its ``fields`` (``example_batches.RecordFields``) say:
    it is parsed, not decoded, a batch at a time (``example_batches.python_batch``)."""
    if kind == "example":
        from schemas.example import parse_features

        return (np.frombuffer(data, np.uint8), *fields.label_and_key(parse_features(data)))
    ex = parse_example(data)
    if kind == "image":
        encoded = ex[features.ENCODED]
    else:
        encoded = storage.read_bytes(layout.join(root, ex[features.PATH].decode()))
    return (
        np.frombuffer(eight_bit_png(encoded), np.uint8),
        ex[features.LABEL],
        ex[features.KEY].decode(),
    )


def eight_bit_png(encoded: bytes) -> bytes:
    """A 16-bit PNG as the 8-bit PNG of its samples' high bytes; any other image as is.

    The readers' rule for 16-bit samples is libpng's strip, the high byte
    (TensorFlow); DALI rounds instead (off by 1 on a quarter of the samples),
    and asking DALI for 16-bit output halved its decode rate for every image.
    16-bit PNGs are rare: they alone are rewritten here, with Pillow and numpy.
    """
    if encoded[:8] != b"\x89PNG\r\n\x1a\n" or len(encoded) < 26 or encoded[24] != 16:
        return encoded
    import io

    from PIL import Image

    color_type = encoded[25]
    transparent = trns(encoded) if color_type in (0, 2) else None
    with Image.open(io.BytesIO(encoded)) as im:
        im.load()
        if color_type == 0:  # gray: Pillow keeps 16 bits (I;16)
            gray = np.asarray(im, np.uint16)
            out = Image.fromarray((gray >> 8).astype(np.uint8), "L")
            if transparent is not None:  # alpha 0 on the exact 16-bit value, as libpng
                alpha = np.where(gray == int.from_bytes(transparent[:2], "big"), 0, 255)
                pair = np.dstack([gray >> 8, alpha]).astype(np.uint8)
                out = Image.fromarray(pair, "LA")
        elif color_type == 2 and transparent is not None:
            # Pillow keeps the high bytes only: libpng (OpenCV) compares all 16 bits
            import cv2

            bgra = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_UNCHANGED)
            rgba = cv2.cvtColor((bgra >> 8).astype(np.uint8), cv2.COLOR_BGRA2RGBA)
            out = Image.fromarray(rgba, "RGBA")
        elif color_type == 4:  # gray+alpha: Pillow gives RGBA of the high bytes
            rgba = np.asarray(im.convert("RGBA"))
            out = Image.fromarray(np.ascontiguousarray(rgba[..., [0, 3]]), "LA")
        else:  # RGB, RGBA: Pillow unpacks the high bytes
            out = im.copy()
    buffer = io.BytesIO()
    out.save(buffer, "PNG", compress_level=0)
    return buffer.getvalue()


def trns(encoded: bytes) -> bytes | None:
    """The body of a PNG's tRNS chunk (before its image data), or None."""
    at = 8
    while at + 8 <= len(encoded):
        size, kind = int.from_bytes(encoded[at : at + 4], "big"), encoded[at + 4 : at + 8]
        if kind == b"tRNS":
            return encoded[at + 8 : at + 8 + size]
        if kind in (b"IDAT", b"IEND"):
            return None
        at += 12 + size
    return None


def image_shape(encoded) -> tuple[int, int]:
    """(height, width) of an encoded image, from its header (Pillow reads no pixels)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(encoded)) as im:
        return im.height, im.width
