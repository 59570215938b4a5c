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

from schemas.errors import InvalidTypeError, InvalidValueError


def checked_spread(views, view_spread, mirror_views: bool, batch_size) -> int | None:
    """The spread of a read's views in batches (None: an image's views together in one
    batch), every setting checked as every face and ``explain`` check them.

    Raises:
        ValueError, TypeError: a setting that is not one, or settings that do not fit.
    """
    if not isinstance(views, int) or isinstance(views, bool) or views < 1:
        raise InvalidValueError(f"views must be a whole number >= 1, got {views!r}")
    if mirror_views and views % 2:
        raise InvalidValueError(
            f"mirror_views pairs each view with its mirror: views must be even, got {views}"
        )
    if view_spread != "together" and not (
        isinstance(view_spread, int) and not isinstance(view_spread, bool) and view_spread > 0
    ):
        raise InvalidValueError(
            f'view_spread must be "together" or a whole number of batches >= 1, got {view_spread!r}'
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidTypeError(f"batch_size must be a whole number (int), got {batch_size!r}")
    if batch_size < 1:
        raise InvalidValueError(f"batch_size must be >= 1, got {batch_size}")
    spread = None if view_spread == "together" or views == 1 else view_spread
    if spread is None and batch_size % views:
        raise InvalidValueError(
            f"batch_size {batch_size!r} must be a multiple of views={views}: the views "
            "of an image go in one batch (or spread them: view_spread=)"
        )
    return spread


def check_blocks(spread: int | None, blocks: int | None) -> None:
    """Raises ValueError when a whole read (of ``blocks`` batches of images; None:
    endless) is too short for its views to go ``spread`` batches apart."""
    if spread and blocks is not None and blocks < spread:
        raise InvalidValueError(
            f"view_spread={spread} needs at least {spread} batches of "
            f"images; this read has {blocks}: lower view_spread (or batch_size)"
        )


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


def skip_limit(views: int, spread: int) -> int:
    """The largest skip ``restart`` gives (counted as an endless read's rounds): the
    outputs of the rounds up to ``(views - 1) * spread`` of the blocks from the first
    unfinished one on, but one."""
    return emitted((views - 1) * spread + 1, views, spread, None) - 1


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
    views: int,
    spread: int,
    skip: int,
    lanes: list[int | None],
    workers: int,
    worker: int,
    own: int | None = None,
) -> tuple[int, list]:
    """An elastic resume of a state saved between the views of its images: who of the new
    ``workers`` sends which of the views the old workers still owed, and when.

    ``lanes[w]``: the blocks old worker w's read has from the saved block on (None:
    endless). Each old worker had sent ``skip`` outputs of its rounds from there, which
    opened its first ``s`` blocks (``started``); their other views are owed. The owed
    views, in the order the old workers would have sent them (due, old worker), go to
    the new workers in turn (the i-th to worker ``i % new``: at most one more for some),
    and each worker sends its next owed view as soon as it is at least ``spread``
    batches (of the whole run) after the view before it of its image, else a batch of
    its own read: an ordinary elastic resume of the old workers' blocks from ``s`` on.
    ``own``: the fewest outputs any new worker's own read has (None: endless); a worker
    that has sent that many sends its owed views at once (the read ends within the
    stretch: their views come closer than ``spread``). A worker sent one owed view fewer
    than the most sends one padding batch, so that every worker is as far into its own
    read when the stretch ends.

    Returns (s, this worker's batches of the stretch): each ``(lane, block, view)``,
    "own" or None (padding)."""
    first = started(skip, views, spread)
    sent, due = {}, []  # (lane, block, view): its batch after the save (before: < 0)
    for w, blocks in enumerate(lanes):
        opened = first if blocks is None else min(first, blocks)
        last = emitted(opened + (views - 1) * spread, views, spread, blocks)  # their last view
        for n, (block, view) in enumerate(rounds(views, spread, blocks)):
            if n >= last:
                break
            if block < opened:  # the others are the new workers' own read
                if n < skip:
                    sent[(w, block, view)] = n - skip
                else:
                    due.append((n - skip, w, block, view))
    queues = [[] for _ in range(workers)]
    for rank, (_, w, block, view) in enumerate(sorted(due)):
        queues[rank % workers].append((w, block, view))
    counts = [len(q) for q in queues]
    plans = [[] for _ in range(workers)]
    # batches other than owed views each worker may send before its owed views go at
    # once (None: any): its own read's, and the padding of one owed view fewer
    left = [None if own is None else own + max(counts) - c for c in counts]
    step = 0
    while any(queues):
        for queue, plan, m in zip(queues, plans, range(workers)):
            ready = (
                i
                for i, (w, block, view) in enumerate(queue)
                if sent.get((w, block, view - 1), step) <= step - spread
            )
            pick = next(ready, None)
            if pick is None and queue and left[m] == 0:
                pick = 0  # nothing else to send
            if pick is not None:
                sent[queue[pick]] = step
                plan.append(queue.pop(pick))
            elif queue:
                plan.append("own")
                left[m] = None if left[m] is None else left[m] - 1
        step += 1
    own_slots = step - max(counts, default=0)  # every worker's own batches in the stretch
    out = []
    for item in plans[worker] + ["own"] * (step - len(plans[worker])):
        if item == "own":
            item = "own" if own_slots else None  # one fewer owed view: one padding batch
            own_slots -= item == "own"
        out.append(item)
    return first, out
