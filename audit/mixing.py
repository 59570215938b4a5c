"""Shuffle-quality metrics over a read order.

- ``label_mix_ratio``: mean total-variation distance between each batch's
  label histogram and the whole order's, divided by the same figure for
  uniform random permutations of the same labels (1.0: as mixed as random;
  below 1: better than random, as a stratified order is; far above: sorted).
- ``order_memory``: Spearman rank correlation between source order and read
  order (0: no memory of the source order; 1: read in source order).
- ``neighbour_repeats``: the fraction of pairs adjacent in one epoch that are
  adjacent again in the next; an independent permutation per epoch gives
  2 / n (``independent_neighbour_repeats``).
"""

from __future__ import annotations

import numpy as np

from schemas.errors import InvalidValueError


def batch_tvd(labels: np.ndarray, batch_size: int) -> float:
    """Mean total-variation distance of full batches' label mix from the overall mix."""
    labels = np.asarray(labels)
    classes, codes = np.unique(labels, return_inverse=True)
    overall = np.bincount(codes, minlength=len(classes)) / len(codes)
    n_batches = len(codes) // batch_size
    if n_batches == 0:
        raise InvalidValueError(
            f"need at least one full batch of {batch_size}, got {len(codes)} labels"
        )
    batches = codes[: n_batches * batch_size].reshape(n_batches, batch_size)
    counts = np.stack([np.bincount(b, minlength=len(classes)) for b in batches]) / batch_size
    return float(np.mean(0.5 * np.abs(counts - overall).sum(axis=1)))


def random_batch_tvd(labels: np.ndarray, batch_size: int, trials: int = 5, seed: int = 0) -> float:
    """batch_tvd of uniform random permutations of the same labels (the ideal)."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    return float(np.mean([batch_tvd(rng.permutation(labels), batch_size) for _ in range(trials)]))


def label_mix_ratio(labels, batch_size: int, trials: int = 5) -> float:
    return batch_tvd(labels, batch_size) / random_batch_tvd(labels, batch_size, trials)


def order_memory(source_index) -> float:
    """Spearman correlation of read position and source position (both ranks)."""
    source = np.asarray(source_index, dtype=np.float64)
    if len(source) < 2:
        return 0.0
    read = np.arange(len(source), dtype=np.float64)
    source_ranks = np.argsort(np.argsort(source, kind="stable"), kind="stable")
    return float(np.corrcoef(read, source_ranks)[0, 1])


def _pairs(order) -> set:
    return {frozenset(p) for p in zip(order[:-1], order[1:])}


def neighbour_repeats(epoch1, epoch2) -> float:
    """Fraction of adjacent pairs of ``epoch1`` that are adjacent in ``epoch2`` too."""
    first = _pairs(list(epoch1))
    return len(first & _pairs(list(epoch2))) / max(1, len(first))


def independent_neighbour_repeats(n: int) -> float:
    """Expected neighbour_repeats of two independent uniform permutations of n items."""
    return 2.0 / n if n > 1 else 0.0
