"""Where the views of an image go when they are spread batches apart.

The records come in blocks of one batch each (block j: the records of output batches
made from the j-th batch of the read). Each block gives V batches, one a view, and
view v of block j goes out in round ``j + v * spread``, the views of a round in view
order: so two views of one image are at least ``spread`` batches apart (once the read
has more than ``spread`` blocks), and a batch holds one view of ``batch_size``
different images, as mixed as a plain read's. The rounds need the views of the
blocks ``(V - 1) * spread`` back in memory, no more.
"""

from __future__ import annotations


def rounds(views: int, spread: int, blocks: int | None):
    """(block, view) in output order, for ``blocks`` blocks (None: without end)."""
    r = 0
    while blocks is None or r - (views - 1) * spread < blocks:
        for v in range(views):
            j = r - v * spread
            if 0 <= j and (blocks is None or j < blocks):
                yield j, v
        r += 1


def emitted(rounds_before: int, views: int, spread: int, blocks: int | None) -> int:
    """The outputs of the rounds before ``rounds_before``."""
    total = 0
    for v in range(views):
        made = max(0, rounds_before - v * spread)
        total += made if blocks is None else min(made, blocks)
    return total


def restart(done: int, views: int, spread: int, blocks: int | None) -> tuple[int, int]:
    """After ``done`` outputs: (the first block with a view still to go, the outputs of
    the rounds from that block on that went out already). A read restarted at that
    block, skipping that many outputs, yields exactly what the read would have."""
    if blocks is not None and done >= blocks * views:  # all out
        return blocks, done - blocks * views
    low, high = 0, max(1, done + 1)  # the round of output number ``done``
    while emitted(high, views, spread, blocks) <= done:
        high *= 2
    while low + 1 < high:  # emitted(low) <= done < emitted(high)
        mid = (low + high) // 2
        if emitted(mid, views, spread, blocks) <= done:
            low = mid
        else:
            high = mid
    first = max(0, low - (views - 1) * spread)
    if blocks is not None:
        first = min(first, blocks)
    return first, done - first * views
