"""Weighted mixing of several evenshard splits: which source each record comes from.

``reader.mix([("out_a/", 0.7), (("out_b/", "val"), 0.3)])`` names the sources; every
reader takes the :class:`Mixture` in place of a dataset folder. Each source is read
as it would be alone (its files, its order, its resume); a schedule says
which source gives each record of the mixed stream (``reader.order.mix``), and
``reader.front.read.resolve`` reads the sources by it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from schemas.errors import InvalidValueError

MAX_RATIO = 1e12  # of the largest weight to the smallest (the schedule's floats hold it)


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Sources and weights of a mixed read: ``sources`` [(data_dir, split)], ``weights``."""

    sources: tuple[tuple[str, str], ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sources:
            raise InvalidValueError("reader.mix needs at least one source")
        for w in self.weights:
            # numpy scalars (np.float32(0.3), np.int64(3)) are numbers too
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real) or not w > 0:
                raise InvalidValueError(f"mixing weights must be numbers > 0, got {w!r}")
            if not math.isfinite(w):
                raise InvalidValueError(f"mixing weights must be finite, got {w!r}")
        weights = tuple(float(w) for w in self.weights)
        if max(weights) / min(weights) > MAX_RATIO:
            raise InvalidValueError(
                f"mixing weights {min(weights):g} and {max(weights):g} are more than "
                f"{MAX_RATIO:g} apart: the smaller source would give one record in more "
                "than that many; drop it from the mix, or raise its weight"
            )
        object.__setattr__(self, "weights", weights)


def mix(sources, split: str = "train") -> Mixture:
    """A weighted mixture of evenshard splits, for any reader in place of ``data_dir``.

    Args:
        sources: [(source, weight)], a source being a dataset folder (its ``split``)
            or a (folder, split) pair; weights are relative (0.7 and 0.3, or 7 and 3).
        split: the split of sources given as a folder alone.

    Example::

        both = reader.mix([("web/", 0.8), (("curated/", "train"), 0.2)])
        ds = reader.make_dataset(both, batch_size=256, seed=0, image_size=(224, 224))
    """
    pairs, weights = [], []
    for item in sources:
        try:
            source, weight = item
        except (TypeError, ValueError):
            raise InvalidValueError(
                f"reader.mix takes (source, weight) pairs, got {item!r}"
            ) from None
        pairs.append((source, split) if isinstance(source, str) else tuple(source))
        weights.append(weight)
    return Mixture(tuple(pairs), tuple(weights))
