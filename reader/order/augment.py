"""The built-in augmentations' draws: a crop box and a flip for each (key, epoch, view).

Every reader (tf.data, DALI, the Python route) asks this module for the boxes of the
images it is about to decode, so for the same record, epoch and view they crop the same
box and flip alike; only the resize's arithmetic differs between them. The crop is
torchvision's ``RandomResizedCrop``: up to 10 tries of an area fraction drawn uniformly
from ``scale`` and an aspect ratio log-uniformly from ``ratio``, the first box that fits
placed uniformly; else the centre crop clamped to ``ratio``. Draws are the order's keyed
hash (purpose ``CROP``), never a process's rng.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from reader.order.draws import CROP, key_digest, rows, uniform

ATTEMPTS = 10  # torchvision's tries before the centre crop


@dataclasses.dataclass(frozen=True)
class Augment:
    """Random resized crop (``crop``, with torchvision's ``scale`` and ``ratio``) and a
    horizontal flip with probability 1/2 (``flip``); ``mirror``: views in mirrored
    pairs, view 2k+1 view 2k's box flipped the other way (view 2k drawn as without)."""

    crop: bool = False
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    mirror: bool = False

    def boxes(self, seed: int, keys, epochs, views, heights, widths) -> np.ndarray:
        """(n, 5) int64: top, left, height, width and flip (0 or 1) of each image;
        ``keys`` str or bytes, the rest ints, one per image."""
        n = len(keys)
        heights = np.asarray(heights, np.int64).reshape(n)
        widths = np.asarray(widths, np.int64).reshape(n)
        digests = np.array([key_digest(k) for k in keys], np.int64).reshape(n)
        epochs = np.asarray(epochs, np.int64).reshape(n)
        views = np.asarray(views, np.int64).reshape(n)
        drawn = views & ~1 if self.mirror else views  # view 2k+1 draws view 2k's
        u = uniform(rows(4 * ATTEMPTS + 1, seed, CROP, digests, epochs, drawn))
        out = np.zeros((n, 5), np.int64)
        out[:, 2], out[:, 3] = heights, widths
        if self.crop:
            for i in range(n):
                out[i, :4] = self._box(int(heights[i]), int(widths[i]), u[i])
        if self.flip:
            out[:, 4] = u[:, -1] < 0.5
        if self.mirror:
            out[:, 4] ^= views & 1
        return out

    def _box(self, height: int, width: int, u: np.ndarray) -> tuple[int, int, int, int]:
        area = height * width
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for attempt in range(ATTEMPTS):
            a, r, y, x = u[4 * attempt : 4 * attempt + 4]
            target = area * (self.scale[0] + a * (self.scale[1] - self.scale[0]))
            aspect = math.exp(low + r * (high - low))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return int(y * (height - h + 1)), int(x * (width - w + 1)), h, w
        ratio = width / height  # the centre crop, its aspect clamped to ratio
        if ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w
