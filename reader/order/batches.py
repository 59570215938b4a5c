"""How many elements a worker's read yields: batch counting across epoch boundaries."""

from __future__ import annotations

import math

from schemas.errors import InvalidValueError


def remaining(
    left: int | None, most: int | None, batch_size: int | None, pad: bool, drop: bool
) -> tuple[int | None, int]:
    """(elements yielded from here on, batches holding real examples): elements are
    batches, or examples without a batch size; None: endless. ``left``: this worker's
    records left; ``most``: the most any worker has left; ``pad``: every worker yields
    the batch count of the one with the most left (collective evaluation steps never
    wait on one); ``drop``: a final partial batch is dropped. Batches come after the
    epochs are joined, so they run across epoch boundaries. Raises ValueError for a
    start past the end (``left`` below 0)."""
    if left is None:
        return None, 0
    unit = batch_size or 1
    if pad:
        elements = math.ceil(most / unit)
    else:
        elements = left // unit if drop else math.ceil(left / unit)
    if elements < 0:  # a start within the last partial batch is the end: 0
        raise InvalidValueError("the start is past the end of this read")
    return elements, max(math.ceil(left / unit), 0) if batch_size else 0


def after(k: int, skips) -> int:
    """The position of the read after ``k`` batches yielded from position 0, passing
    over the ``skips`` ([first, stop) positions, sorted, apart): a position in a skip
    is its stop."""
    p = 0
    for first, stop in skips:
        if p + k < first:
            return p + k
        k -= max(first - p, 0)
        p = max(p, stop)
    return p + k


def yielded(total: int | None, skips) -> int | None:
    """Batches yielded of ``total`` positions (None: endless), the ``skips`` left out."""
    if total is None:
        return None
    return total - sum(max(0, min(stop, total) - max(first, 0)) for first, stop in skips)


def skipped(position: int, skips) -> bool:
    return any(first <= position < stop for first, stop in skips)
