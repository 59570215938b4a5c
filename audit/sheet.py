"""``evenshard leaks --sheet``: the closest pairs of the report as a PNG, the two images
of a pair side by side."""

from __future__ import annotations

import os

import numpy as np

from audit.leaks import Side, closeness, shown
from schemas import near
from schemas.errors import InvalidValueError, StorageError


def check_sheet(path: str) -> None:
    """Refuses a ``--sheet`` path the PNG cannot be written to, before any work."""
    if not path.lower().endswith(".png") or os.path.isdir(path):
        raise InvalidValueError(f"--sheet {path}: name a .png file to write the contact sheet to")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidValueError(f"--sheet {path}: folder {folder} does not exist")


SHEET_ROWS = 12  # the closest pairs a contact sheet draws


def contact_sheet(sides: list[Side], report: dict, path: str, rows: int = SHEET_ROWS) -> int:
    """A PNG of the closest pairs (at most ``rows``), one a row: the two images (scaled to
    128 px a side, small ones up), their splits, keys, bits. Returns the pairs drawn; 0
    when the report lists none: nothing is written, and a sheet an earlier run left at
    ``path`` is removed (it would show pairs this run did not find)."""
    from PIL import Image, ImageDraw, ImageFont

    pairs = report["closest"][:rows]
    if not pairs:
        if os.path.isfile(path):
            os.remove(path)
        return 0
    font = ImageFont.load_default(size=15)
    offsets = np.cumsum([0] + [len(s.keys) for s in sides])
    thumb, text_width = 128, 520
    sheet = Image.new("RGB", (2 * thumb + text_width + 30, len(pairs) * (thumb + 10) + 10), "white")
    draw = ImageDraw.Draw(sheet)
    for row, pair in enumerate(pairs):
        y = 10 + row * (thumb + 10)
        for col, index in enumerate(pair["index"]):
            side = int(np.searchsorted(offsets, index, side="right") - 1)
            image = _thumbnail(sides[side].image(index - int(offsets[side])), thumb)
            sheet.paste(image, (10 + col * (thumb + 5), y), image)
        a, b = pair["a"], pair["b"]
        lines = [
            closeness(pair).strip() + ("" if pair["grouped_by_convert_rule"] else " (*)"),
            f"{a['split']}: {shown(a['key'])}",
            f"{b['split']}: {shown(b['key'])}",
        ]
        draw.multiline_text(
            (2 * thumb + 25, y + 10), "\n".join(lines), fill="black", font=font, spacing=8
        )
    try:
        sheet.save(path, "PNG")
    except OSError as e:
        raise StorageError(f"--sheet {path}: {e.strerror or e}") from None
    return len(pairs)


def _thumbnail(image, size: int):
    """``image`` as RGBA, its longer side ``size`` px: shrunk smoothly, enlarged by
    repeating pixels (an icon stays sharp); transparency kept (palette transparency
    included, which Pillow warns about converting to RGB)."""
    from PIL import Image

    if image.mode in near.WIDE_MODES:  # 16-bit and float: scaled to 8 bits, as hashed
        image = near.composited(image)
    image = image.convert("RGBA")
    scale = size / max(image.size)
    new = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(new, Image.LANCZOS if scale < 1 else Image.NEAREST)
