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


def started(done: int, views: int, spread: int) -> int:
    """The blocks with a view among the first ``done`` outputs (view 0 of block j opens
    round j, so they are the blocks up to the round of output ``done - 1``)."""
    if done == 0:
        return 0
    low, high = 0, done  # emitted(low) < done <= emitted(high): that round is ``low``
    while low + 1 < high:
        mid = (low + high) // 2
        if emitted(mid, views, spread, None) < done:
            low = mid
        else:
            high = mid
    return high if emitted(low, views, spread, None) >= done else low + 1


def handover(
    views: int, spread: int, skip: int, lanes: list[int | None], workers: int, worker: int
) -> tuple[int, list]:
    """An elastic resume of a state saved between the views of its images: who of the new
    ``workers`` sends which of the views the old workers still owed, and when.

    ``lanes[w]``: the blocks old worker w's read has from the saved block on (None:
    endless). Each old worker had sent ``skip`` outputs of its rounds from there, which
    opened its first ``s`` blocks (``started``); their other views are owed, output t
    of an old worker's rest *due* t batches after the save. With c = ceil(old / new),
    the owed view of old worker w due at t goes out at batch ``t·c + w // new`` (never
    before it is due, so two views of an image stay at least ``spread`` batches apart:
    c·spread), from the new workers in turn (the owed views in (due, old worker) order,
    the i-th from worker ``i % new``: at most one more for some). Every other batch of
    that stretch is the worker's own read: an ordinary elastic resume of the old
    workers' blocks from ``s`` on; a worker sent one owed view fewer than the most sends
    one padding batch, so that every worker is as far into its own read when the
    stretch ends.

    Returns (s, this worker's batches of the stretch): each ``(lane, block, view)``,
    "own" or None (padding)."""
    first = started(skip, views, spread)
    due = []  # (due, lane, block, view): the views of the first blocks still owed
    for w, blocks in enumerate(lanes):
        opened = first if blocks is None else min(first, blocks)
        last = emitted(opened + (views - 1) * spread, views, spread, blocks)  # their last view
        for n, (block, view) in enumerate(rounds(views, spread, blocks)):
            if n >= last:
                break
            if n >= skip and block < opened:  # the others are the new workers' own read
                due.append((n - skip, w, block, view))
    mine, counts, length = {}, [0] * workers, 0
    stretch = -(-len(lanes) // workers)  # batches a batch of the old workers' takes
    for rank, (t, w, block, view) in enumerate(sorted(due)):
        step, to = t * stretch + w // workers, rank % workers
        counts[to] += 1
        length = max(length, step + 1)
        if to == worker:
            mine[step] = (w, block, view)
    own = length - max(counts)  # batches of its own read every worker makes in the stretch
    plan = []
    for step in range(length):
        if step in mine:
            plan.append(mine[step])
        elif own:
            plan.append("own")
            own -= 1
        else:
            plan.append(None)
    return first, plan
