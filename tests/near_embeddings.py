"""Small deterministic embedding functions for ``--near_embedding`` (tests/test_near_embedding.py),
importable by the workers as ``tests.near_embeddings:NAME``.

A colour histogram: 4 levels a channel (64 bins), each bin's share of the pixels. A
resized, re-encoded or slightly brightened copy keeps its colours; two pictures
painted from different palettes share few bins.
"""

from __future__ import annotations

import numpy as np

LEVELS = 4  # a channel's levels: 64 bins in all


def histogram(image: np.ndarray) -> np.ndarray:
    """An RGB image (H x W x 3, uint8) -> its 64 bins' shares of the pixels."""
    q = image.reshape(-1, 3).astype(np.int64) * LEVELS // 256
    bins = (q[:, 0] * LEVELS + q[:, 1]) * LEVELS + q[:, 2]
    return np.bincount(bins, minlength=LEVELS**3) / len(bins)


def histograms(images: list[np.ndarray]) -> np.ndarray:
    """The same, for a batch: one row an image."""
    return np.stack([histogram(im) for im in images])


histograms.batched = True  # called with a list of images
histograms.batch_size = 3  # ... at most this many at a time


def flat(image: np.ndarray) -> np.ndarray:
    """A 2-D output: not the 1-D vector convert asks for."""
    return np.zeros((2, 2))


NOT_A_FUNCTION = 3


def one_longer(image: np.ndarray) -> np.ndarray:
    """The histogram, one value longer for the one image whose top-left pixel is the
    brightest of the corpus's: vectors of two lengths in one run."""
    vector = histogram(image)
    return np.append(vector, 1.0) if int(image[0, 0].sum()) >= 700 else vector


def generated(images: list[np.ndarray]):
    """A batched function that returns a generator, not one row an image."""
    return (histogram(im) for im in images)


generated.batched = True


def alike(image: np.ndarray) -> np.ndarray:
    """The same vector for every image: every pair at cosine 1."""
    return np.ones(8)


def raising(image: np.ndarray) -> np.ndarray:
    """A model that fails."""
    raise RuntimeError("model exploded")
