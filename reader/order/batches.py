"""How many elements a worker's read yields: batch counting across epoch boundaries."""

from __future__ import annotations

import math


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
        raise ValueError("the start is past the end of this read")
    return elements, max(math.ceil(left / unit), 0) if batch_size else 0
