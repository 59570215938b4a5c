"""Feature keys and record kinds: the names every evenshard record uses.

Keys follow TensorFlow's image conventions (``image/encoded``, ...), so the
records read like those of TFDS and the TF object-detection API. Writer,
reader, validator and schemas (``image.pbtxt``, ``path.pbtxt``) use these
names; nothing else spells them.
"""

from __future__ import annotations

from schemas.errors import InvalidValueError

ENCODED = "image/encoded"  # bytes: the image file as stored (image kind)
PATH = "image/path"  # bytes: path relative to path_root (path kind)
FORMAT = "image/format"  # bytes: jpeg, png, gif, bmp, webp
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
LABEL = "image/class/label"  # int64: index into labels.txt
TEXT = "image/class/text"  # bytes: the label text
KEY = "image/key"  # bytes: the example's stable unique key

RECORD_KINDS = ("image", "path")


def payload(kind: str) -> str:
    """The feature that carries the image: its bytes (image kind) or its path."""
    if kind not in RECORD_KINDS:
        raise InvalidValueError(f"record kind must be one of {RECORD_KINDS}, got {kind!r}")
    return ENCODED if kind == "image" else PATH
