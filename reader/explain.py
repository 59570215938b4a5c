"""Which records each batch of a read holds, computed without reading them: ``explain``.

The read order is a function of a few integers (``reader.order``), so the batches of
any steps of any worker, from any state, are computable: the same ``Read`` every face
resolves (``reader.front.read.resolve``: resume, elastic lead, mixing schedule), its stream of
records laid out by position, cut into batches as the faces cut it, the views as
``NumpyReader`` deals them (together, or spread by ``reader.order.views``), the crops
and flips drawn by ``reader.order.augment``. Only the keys (and the image sizes the
crops need) come from the shards: each record's features but its image, read once a
shard by the DALI index (two small reads a record: the fields before the image, and
those after it; docs/design.md, "Which records were in step s").
"""

from __future__ import annotations

import json

import numpy as np

from reader.front.read import Read, merge, resolve, start_state
from reader.front.shard_keys import ShardKeys, key_feature
from reader.order.batches import skipped
from reader.order.views import check_blocks, checked_spread, emitted
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas.errors import InvalidTypeError, InvalidValueError


def explain(
    data,
    split: str = "train",
    batch_size: int = 32,
    steps=range(1),
    options: ReadOptions | None = None,
    *,
    state=None,
    views: int = 1,
    view_spread: int | str = "together",
    mirror_views: bool = False,
    **overrides,
) -> list[dict]:
    """The batches of ``steps`` of a read, without reading it: each a dict of ``step``,
    ``key`` (list), ``epoch``, ``view``, ``mask`` and, with ``random_crop`` or
    ``random_flip`` (or ``mirror_views``), ``box`` (top, left, height, width) and
    ``flip``, a row each, as the readers yield them (padding rows, and those of keys
    the state excludes: key "", mask False; ``excluded`` True on the latter, so an
    evaluation can count them apart).

    Args:
        data, split, batch_size, options, overrides: the read's, as given to
            ``make_dataset``, ``NumpyReader`` or ``TorchReader`` (``num_workers`` and
            ``worker_index``: the rank; a shuffled read needs its ``seed``).
        steps: the steps (an iterable of ints, or (first, stop)). Without a state,
            step s is batch s of the read from its start (``start_step`` on); with
            one, the first batch the resumed read yields is the state's ``step``
            (with views spread: ``step * views + view_skip``), and steps count as
            the state counts them: a step it skips yields no batch and is left out.
        state: a ``ReadState``, its JSON, or a reader's ``state_dict()``.
        views, view_spread, mirror_views: the read's, as given to ``NumpyReader`` or
            ``make_dataset``.

    Raises:
        ValueError: a step before the state or past the read's end; a state
            ``explain`` cannot follow (a views handover in progress); as the readers.
        DatasetError: as the readers; a shard without a DALI index (gzip).
    """
    o = merge(options, overrides)
    spread = checked_spread(views, view_spread, mirror_views, batch_size)
    records = batch_size if spread is not None else batch_size // views
    if state is None:
        if o.seed is None and (o.shuffles(split) or o.augmenting):
            raise InvalidValueError("explain needs the seed of the read: give seed= (or its state)")
        (saved, o), skip = start_state(o, split, records), 0
    else:
        saved, skip = _state(state, o, views, spread)
    read = resolve(data, split, records, o, saved)
    if state is None:  # the whole read, as the readers check it
        check_blocks(spread, read.remaining)
    base = saved.step * views + skip if spread else saved.step
    plan = Explain(read, views, spread, skip, o.augment(mirror_views))
    if isinstance(steps, tuple) and len(steps) == 2:
        steps = range(*steps)
    # the step after the read's last (None: endless); a state's skipped steps count
    end = None
    if read.remaining is not None:
        end = base - skip + read.remaining * views if spread else base + read.remaining
    out = []
    for s in steps:
        if s < base:
            raise InvalidValueError(
                f"step {s} is before the state's first step ({base}): explain it from an "
                "earlier state, or from the read's start (no state)"
            )
        if end is not None and s >= end:
            raise InvalidValueError(
                f"step {s} is past the end of the read, whose last step is {end - 1}: ask "
                "for earlier steps, or read more epochs (endless: epochs=None, or the "
                "command's --epochs 0)"
            )
        if spread is None and skipped(int(s) - base, read.skips):
            continue  # the state skips it: no batch is yielded for this step
        out.append({"step": int(s), **plan.batch(int(s) - base)})
    return out


def _state(state, o: ReadOptions, views: int, spread) -> tuple[ReadState, int]:
    """A given state as a ReadState, and the views already out after it (``view_skip``)."""
    skip, handed, order = 0, None, None
    if isinstance(state, dict) and "read_state" not in state:  # a ReadState's fields
        state = ReadState.from_json(json.dumps(state))
    if isinstance(state, dict):
        skip, handed = state.get("view_skip", 0), state.get("view_handover")
        order, state = state.get("view_order"), state["read_state"]
    if isinstance(state, str):
        state = ReadState.from_json(state)
    if not isinstance(state, ReadState):
        raise InvalidTypeError(
            f"state must be a ReadState, its JSON or a state_dict(), got {state!r}"
        )
    mine = f"view_spread={spread or 'together'} views={views}"
    if order is not None and order.replace(" mirror_views=True", "") != mine:
        raise InvalidValueError(f"the state was saved reading {order}, explain is asked for {mine}")
    workers = o.workers()[0]
    if skip and (handed is not None or state.num_workers not in (None, workers)):
        raise InvalidValueError(
            "explain does not follow an elastic handover of views (a state saved between "
            "the views of its images, resumed by another worker count): explain from a "
            "state saved after it, or with the saved worker count"
        )
    return state, skip


class Explain:
    """The batches of one resolved read (see ``explain``): ``batch(k)`` is the k-th
    batch it yields. ``keys``: per source, a function of (lead?, ids) -> (keys,
    heights, widths); default: read from the source's shards (``ShardKeys``)."""

    def __init__(self, read: Read, views: int = 1, spread=None, skip: int = 0, augment=None):
        self.read, self.views, self.spread, self.skip = read, views, spread, skip
        self.augment = augment
        if spread is not None and read.skips:
            raise InvalidValueError("the state skips steps: skip with views together, not spread")
        self.records = read.batch_size or 1
        self.keys = [_SourceKeys(source.share, _key_feature(source)) for source in read.sources]
        self._orders: list[dict] = [{} for _ in read.sources]
        o, index = read.options, read.options.workers()[1]
        if read.schedule is not None:
            size = read.schedule.size
            self.left = None if size is None else size - read.start
        else:
            lefts = read.sources[0].share.lefts
            self.left = None if lefts is None else lefts[index]
        self.pad = o.pad_final_batch

    def batch(self, k: int) -> dict:
        """The batch at position k of this read (counted from its start as its state
        counts steps: a step the state skips keeps its number and yields no batch)."""
        if self.spread is None:
            if skipped(k, self.read.skips):
                raise InvalidValueError(f"step {k} of the read is one its state skips: no batch")
            rows = self._read_batch(k)
            n = len(rows["key"])
            return self._views(
                rows, np.repeat(np.arange(n), self.views), np.tile(np.arange(self.views), n)
            )
        block, view = self._round(self.skip + k)
        rows = self._read_batch(block)
        return self._views(rows, np.arange(len(rows["key"])), np.full(len(rows["key"]), view))

    def _round(self, n: int) -> tuple[int, int]:
        """(block, view) of output ``n`` of the spread rounds (``views.rounds``)."""
        blocks, views, spread = self.read.remaining, self.views, self.spread
        if blocks is not None and n >= blocks * views:
            raise InvalidValueError(
                f"batch {n} is past the end of the read ({blocks * views} batches)"
            )
        low, high = 0, n + 1
        while emitted(high, views, spread, blocks) <= n:
            high *= 2
        while low + 1 < high:  # the round of output n: emitted(low) <= n < emitted(high)
            mid = (low + high) // 2
            if emitted(mid, views, spread, blocks) <= n:
                low = mid
            else:
                high = mid
        at = n - emitted(low, views, spread, blocks)
        for v in range(views):
            j = low - v * spread
            if 0 <= j and (blocks is None or j < blocks):
                if at == 0:
                    return j, v
                at -= 1
        raise AssertionError("unreachable")  # pragma: no cover

    def _views(self, rows: dict, pick: np.ndarray, view: np.ndarray) -> dict:
        keys = [rows["key"][i] for i in pick]
        out = {
            "key": keys,
            "epoch": rows["epoch"][pick],
            "view": view.astype(np.int64),
            "mask": rows["mask"][pick],
            "excluded": rows["excluded"][pick],
        }
        if self.augment is not None:
            boxes = np.zeros((len(keys), 5), np.int64)
            real = out["mask"]
            if real.any():
                boxes[real] = self.augment.boxes(
                    self.read.seed,
                    [k for k, m in zip(keys, real) if m],
                    out["epoch"][real],
                    view[real],
                    rows["height"][pick][real],
                    rows["width"][pick][real],
                )
            out["box"], out["flip"] = boxes[:, :4], boxes[:, 4].astype(bool)
        return out

    def _read_batch(self, k: int) -> dict:
        """Rows of the read's batch ``k``: key, epoch, mask, height, width."""
        total = self.read.remaining
        if k < 0 or (total is not None and k >= total):
            raise InvalidValueError(f"batch {k} is past the end of the read ({total} batches)")
        first = k * self.records
        stop = first + self.records
        if self.left is not None:
            stop = min(stop, self.left)
        n = max(stop - first, 0)
        keys, heights, widths, epochs = self._stream(first, n)
        size = self.records if self.pad else n
        pad = size - n
        kept = np.array([k not in self.read.excluded for k in keys], bool)  # else padding
        return {
            "key": [k if m else "" for k, m in zip(keys, kept)] + [""] * pad,
            "epoch": np.concatenate([np.where(kept, epochs, 0), np.zeros(pad, np.int64)]),
            "mask": np.concatenate([kept, np.zeros(pad, bool)]),
            "excluded": np.concatenate([~kept, np.zeros(pad, bool)]),
            "height": np.concatenate([heights, np.zeros(pad, np.int64)]),
            "width": np.concatenate([widths, np.zeros(pad, np.int64)]),
        }

    def _stream(self, first: int, n: int):
        """Keys, heights, widths and epochs of records [first, first + n) of the stream."""
        read = self.read
        if read.schedule is None:
            return self._source(0, first, n)
        at = read.start + first
        chosen = read.schedule.choices(at, at + n)
        before = read.schedule.counts(at) - read.schedule.counts(read.start)
        keys = [""] * len(chosen)
        heights, widths, epochs = (np.zeros(len(chosen), np.int64) for _ in range(3))
        for i in range(len(read.sources)):
            rows = np.flatnonzero(chosen == i)
            if len(rows):
                k, h, w, e = self._source(i, int(before[i]), len(rows))
                for r, key in zip(rows, k):
                    keys[r] = key
                heights[rows], widths[rows], epochs[rows] = h, w, e
        return keys, heights, widths, epochs

    def _source(self, i: int, first: int, n: int):
        """Records [first, first + n) of source i's stream: its lead, then its order."""
        share = self.read.sources[i].share
        k = np.arange(first, first + n, dtype=np.int64)
        led = len(share.lead[0]) if share.lead is not None else 0
        in_lead = k < led
        ids, epochs = np.zeros(n, np.int64), np.zeros(n, np.int64)
        if in_lead.any():
            ids[in_lead] = share.lead[0][k[in_lead]]
            epochs[in_lead] = share.lead[1][k[in_lead]]
        own = share.start + k[~in_lead] - led
        epoch, position = np.divmod(own, share.plan.size)
        mine = np.empty(len(own), np.int64)
        for e in np.unique(epoch):
            at = epoch == e
            mine[at] = self._order(i, int(e))[position[at]]
        ids[~in_lead], epochs[~in_lead] = mine, epoch
        keys, heights, widths = self.keys[i].of(ids, in_lead)
        return keys, heights, widths, epochs

    def _order(self, i: int, epoch: int) -> np.ndarray:
        orders = self._orders[i]
        if epoch not in orders:
            if len(orders) > 2:
                orders.pop(next(iter(orders)))
            orders[epoch] = self.read.sources[i].share.plan.epoch_order(epoch)
        return orders[epoch]


class _SourceKeys:
    """A source's keys: of its own shards (ids over them) and of the split (the lead)."""

    def __init__(self, share, key: str):
        self.own = ShardKeys(share.shards, key)
        self.split = ShardKeys(share.split, key) if share.split else None

    def of(self, ids: np.ndarray, in_lead: np.ndarray):
        keys = [""] * len(ids)
        heights, widths = np.zeros(len(ids), np.int64), np.zeros(len(ids), np.int64)
        for table, rows in ((self.own, ~in_lead), (self.split, in_lead)):
            rows = np.flatnonzero(rows)
            if len(rows):
                k, heights[rows], widths[rows] = table.of(ids[rows])
                for r, key in zip(rows, k):
                    keys[r] = key
        return keys, heights, widths


def to_json(batches: list[dict]) -> str:
    """The batches as JSON: a list of objects, arrays as lists."""
    return json.dumps(
        [{k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in b.items()} for b in batches]
    )


def render(batches: list[dict]) -> str:
    """The batches as a table: a line a row (step, row, epoch, view, key; box and flip
    when drawn)."""
    boxed = bool(batches) and "box" in batches[0]
    head = "step  row  epoch  view  " + ("top  left  height  width  flip  " if boxed else "")
    lines = [head + "key"]
    for b in batches:
        for r, key in enumerate(b["key"]):
            cells = [b["step"], r, b["epoch"][r], b["view"][r]]
            if boxed:
                cells += [*b["box"][r], int(b["flip"][r])]
            shown = key if b["mask"][r] else "(excluded)" if b["excluded"][r] else "(padding)"
            lines.append("  ".join(f"{c:>4}" for c in cells) + "  " + shown)
    return "\n".join(lines)


def _key_feature(source) -> str:
    """The feature a source's keys are in: ``key``, or records that are not images' key
    feature (refused in one line when they were converted without one)."""
    key = key_feature(source.info)
    if key is None:
        raise InvalidValueError(
            f"explain names records by key, and {source.data_dir} was converted without "
            "--key_feature (records that are not images): convert with --key_feature"
        )
    return key
