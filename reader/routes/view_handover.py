"""Views owed across an elastic resume: a state saved between the views of its
images, resumed by another worker count (``reader/order/views.py``, ``handover``),
and the row helpers the Python route's views share."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from reader.order.batches import remaining
from reader.order.views import handover
from reader.records.source import RecordSource
from reader.values.state import ReadState
from schemas.errors import InvalidValueError


class ViewHandover:
    """A state saved between the views of its images, resumed by another worker count:
    this worker's share of the views the old workers still owed (``views.handover``),
    merged with its own read (``reader/order/views.py``).

    Args:
        route: the read's :class:`reader.routes.python_route.PythonRoute` (its arguments,
            views, view spread and own read).
        saved, skip, handed: the saved state, its ``view_skip`` and ``view_handover``.
    """

    def __init__(self, route, saved: ReadState, skip: int, handed):
        data_dir, split, records, options = route.args
        workers, index = options.workers()
        if handed is not None:
            if (
                not isinstance(handed, (list, tuple))
                or len(handed) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in handed)
                or handed[0] < 1
                or handed[1] < 0
            ):
                raise InvalidValueError(
                    f"view_handover must be [workers >= 1, batches >= 0], got {handed!r}"
                )
            if saved.num_workers is None:
                raise InvalidValueError(
                    "view_handover with a read_state that names no num_workers: resume "
                    "the state as state_dict() gave it"
                )
            if handed[0] != workers:
                raise InvalidValueError(
                    f"this state was saved by {handed[0]} workers {handed[1]} batches into "
                    "sending the views an elastic resume handed over to them: resume it with "
                    f"{handed[0]} workers (a state saved once they are sent resumes with any)"
                )
        old = saved.num_workers
        self.lanes = [
            RecordSource(
                data_dir,
                split,
                records,
                dataclasses.replace(options, input_context=None, num_workers=old, worker_index=w),
                saved,
                placed=True,
            )
            for w in range(old)
        ]
        sizes = [block_count(lane) for lane in self.lanes]
        self.views, self.saved, self.skip = route.views, saved, skip
        _, self.plan = handover(
            route.views, route.spread, skip, sizes, workers, index, fewest(route)
        )
        self.start = 0 if handed is None else handed[1]
        if self.start > len(self.plan):
            raise InvalidValueError(
                f"view_handover {handed!r}: the handover of this state is {len(self.plan)} "
                "batches long"
            )
        self.own_before = self.plan[: self.start].count("own")
        self.route = route
        # the owed views' blocks, in the order they are first needed, and each one's last
        self.needed, self.last = [], {}
        for step in range(self.start, len(self.plan)):
            if isinstance(self.plan[step], tuple):
                w, block, _ = self.plan[step]
                if (w, block) not in self.last:
                    self.needed.append((w, block))
                self.last[(w, block)] = step

    def blocks(self):
        """The encoded batches of the blocks this worker sends owed views of, in the
        order it first needs them (each old worker's read up to the last one)."""
        read = {}
        for w in sorted({w for w, _ in self.needed}):
            top = max(block for lane, block in self.needed if lane == w)
            read[w] = list(itertools.islice(iter(self.lanes[w]), top + 1))
        for w, block in self.needed:
            yield read[w][block]

    def merge(self, outputs, own_batches):
        """This worker's batches: the stretch of the handover (owed views, its own read,
        padding), then its own read (``own_batches`` makes it from the outputs)."""
        route, held, pulled = self.route, {}, 0

        def pull(upto: int) -> None:
            nonlocal pulled
            while pulled < upto:
                held[self.needed[pulled]] = next(outputs)
                pulled += 1

        def own_outputs():
            pull(len(self.needed))  # the own read comes after the owed blocks
            yield from outputs

        own = own_batches(own_outputs())
        index = {block: i for i, block in enumerate(self.needed)}

        def like() -> dict:  # a batch to shape padding after, before any went out
            if self.needed:
                pull(1)
                return rows(held[self.needed[0]], 0, self.views)
            return route.filler()

        last = None
        for step in range(self.start, len(self.plan)):
            item = self.plan[step]
            batch = None
            if isinstance(item, tuple):
                w, block, view = item
                pull(index[(w, block)] + 1)
                batch = rows(held[(w, block)], view, self.views)
                if self.last[(w, block)] == step:
                    del held[(w, block)]
            elif item == "own":
                batch = next(own, None)
            if batch is None:  # padding; or the own read ended within the stretch
                batch = padding_like(last if last is not None else like())
            last = batch
            yield batch
        yield from own


def fewest(route) -> int | None:
    """The fewest outputs any worker's own read has (None: endless, or unknown)."""
    read = route.source.read
    lefts = read.sources[0].share.lefts if len(read.sources) == 1 else None
    if lefts is None:
        return None
    o, records = read.options, route.args[2]
    batches = (
        remaining(n, max(lefts), records, o.pad_final_batch, o.drop_remainder) for n in lefts
    )
    return min(n for n, _ in batches) * route.views


def block_count(source: RecordSource) -> int | None:
    """The batches of images a read has (None: an endless read)."""
    try:
        return len(source)
    except TypeError:
        return None


def padding_like(like: dict) -> dict:
    """A batch of padding rows (``mask`` False, key empty, label 0) shaped as ``like``
    (its own copies)."""
    out = {k: v.copy() if isinstance(v, np.ndarray) else list(v) for k, v in like.items()}
    out["mask"] = np.zeros_like(like["mask"])
    out["key"] = [""] * len(like["key"])
    if isinstance(like.get("label"), np.ndarray):
        out["label"] = np.zeros_like(like["label"])
    return out


def rows(out: dict, view: int, views: int) -> dict:
    """The rows of one view of a batch whose rows are images x views."""
    return {
        name: np.ascontiguousarray(value[view::views])
        if isinstance(value, np.ndarray)
        else value[view::views]
        for name, value in out.items()
    }
