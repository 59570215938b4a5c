"""Batches of numpy arrays, for JAX and plain Python: ``NumpyReader``, with a Python
transform run in worker processes (``reader.preprocess``).

    from reader import NumpyReader

    def augment(example, rng):          # at the top level of a module: it is pickled
        image = example["image"]        # uint8 HWC, decoded once
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return {**example, "image": image}

    train = NumpyReader("out/", "train", 256, transform=augment, image_size=(224, 224),
                        seed=0, epochs=None, num_processes=8)
    for batch in train:                 # {"image", "label", "key", "view", "epoch", "mask"}
        ...
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from reader.options import ReadOptions
from reader.order.batches import remaining
from reader.order.views import handover, restart, rounds, skip_limit, started
from reader.preprocess import Preprocess, check_transform, default_processes
from reader.read import check_sized, check_state, merge, start_state
from reader.source import RecordSource
from reader.state import ReadState, changes


class NumpyReader:
    """Batches of one split as dicts of numpy arrays; ``len()`` is the number of batches.

    The records are read in the reader's one order (the same as ``make_dataset`` and
    ``TorchReader`` for the same options), decoded once each (libjpeg-turbo or
    Pillow, ``reader/pixels.py``) in worker processes, and given to ``transform``
    once a view.

    Args:
        data_dir, split, batch_size, options, overrides: as for ``reader.make_dataset``
            (``data_dir`` may be a ``reader.mix``); ``image_size``: each decoded image
            (its crop with ``random_crop``) is resized to it (bilinear) before
            ``transform`` sees it; needed without a transform, so that the batch stacks.
        transform: ``fn(example, rng) -> dict`` (None: decode only). ``example`` holds
            ``image`` (uint8 HWC), ``label``, ``key``, ``epoch`` and ``view``; ``rng`` is
            a ``numpy.random.Generator`` seeded by (seed, key, epoch, view), so the output
            is the same for any ``num_processes`` and after any resume. What it returns
            goes out as it is: values that are arrays of one shape (or numbers: 1 and
            0.5 at their common type) are stacked, others come as lists. Every example
            must return the same fields (None where one has no value): a field some
            lack stops the read, naming it.
        views: transformed views of each decoded image (each image decoded once).
        mirror_views: views in mirrored pairs (``views`` even): view 2k+1 is view 2k's
            crop (``random_crop``), flipped ("5 random crops and their mirrors":
            ``views=10``).
        view_spread: where the views go: ``"together"`` (default), consecutive in one
            batch (``batch_size`` a multiple of ``views``: SimCLR/DINO pairs); or a
            whole number D, each batch one view of ``batch_size`` images and the views
            of an image at least D batches apart (``reader/order/views.py``).
        num_processes: worker processes (default: the cores; 0: in this process).
        state: a :class:`reader.ReadState` to resume (any worker count).

    Raises:
        TypeError: a transform that cannot be sent to worker processes (a lambda).
        ValueError, DatasetError: as ``make_dataset``.
    """

    def __init__(
        self,
        data_dir,
        split: str = "train",
        batch_size: int = 32,
        options: ReadOptions | None = None,
        *,
        transform=None,
        views: int = 1,
        view_spread: int | str = "together",
        mirror_views: bool = False,
        num_processes: int | None = None,
        state: ReadState | None = None,
        **overrides,
    ):
        options = merge(options, overrides)
        check_state(state)
        if not options.decode:
            raise ValueError(
                "NumpyReader decodes every image (a transform is given its pixels): "
                "decode=False is not an option here; read the encoded bytes with "
                "reader.make_dataset(decode=False)"
            )
        if transform is not None and not callable(transform):
            raise TypeError(
                f"transform must be a function fn(example, rng) -> dict, got {transform!r}"
            )
        if not isinstance(views, int) or isinstance(views, bool) or views < 1:
            raise ValueError(f"views must be a whole number >= 1, got {views!r}")
        if mirror_views and views % 2:
            raise ValueError(
                f"mirror_views pairs each view with its mirror: views must be even, got {views}"
            )
        if view_spread != "together" and not (
            isinstance(view_spread, int) and not isinstance(view_spread, bool) and view_spread > 0
        ):
            raise ValueError(
                f'view_spread must be "together" or a whole number of batches >= 1, '
                f"got {view_spread!r}"
            )
        self.spread = None if view_spread == "together" or views == 1 else view_spread
        together = self.spread is None
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size must be a whole number (int), got {batch_size!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if together and batch_size % views:
            raise ValueError(
                f"batch_size {batch_size!r} must be a multiple of views={views}: the views "
                "of an image go in one batch (or spread them: view_spread=)"
            )
        if num_processes is None:
            num_processes = default_processes()
        if not isinstance(num_processes, int) or num_processes < 0:
            raise ValueError(f"num_processes must be a whole number >= 0, got {num_processes}")
        if num_processes:
            check_transform(transform)  # refused now, not in a process later
        self.transform, self.views, self.num_processes = transform, views, num_processes
        self.mirror = bool(mirror_views)
        records = batch_size // views if together else batch_size  # a batch of the read
        started = state is None  # the whole read: the spread is checked against it
        if started:  # the read as a state from its start: state_dict() says where
            state, options = start_state(options, split, records)
        self._args = (data_dir, split, records, options)
        self.options = options
        self.decoded = 0  # images decoded by the last iteration (once each, any views)
        self.load_state_dict({"read_state": state.to_json()})
        if transform is None:  # the decoded images themselves are batched
            check_sized(options, batch_size)
        if started and self.spread and self._blocks is not None and self._blocks < self.spread:
            raise ValueError(
                f"view_spread={self.spread} needs at least {self.spread} batches of "
                f"images; this read has {self._blocks}: lower view_spread (or batch_size)"
            )

    def state_dict(self) -> dict:
        """Where this reader stands: ``{"read_state": ReadState JSON}``, advanced by the
        batches this iteration yielded; with views spread, the read's state at the first
        image with a view still to go, ``view_skip``: the views from there on that went
        out already. ``view_order``: the views, view_spread and mirror_views, which the
        views and their order depend on (a resume under others is refused). Resumed by
        another worker count, the views still owed are handed over
        (``reader/order/views.py``, ``handover``); a state saved while they are, the
        saved state as it was and ``view_handover``: [workers, batches]."""
        views = {"view_order": self._view_order()}
        if self.spread is None:
            return {"read_state": self._state.advance(self._consumed).to_json(), **views}
        hand = self._handover
        if hand is not None and hand.start + self._consumed < len(hand.plan):
            return {
                "read_state": hand.saved.to_json(),
                "view_skip": hand.skip,
                "view_handover": [self._args[3].workers()[0], hand.start + self._consumed],
                **views,
            }
        # rounds counted as an endless read's: the same state on every worker, whatever
        # its own block count (a block the endless rounds finished, a worker's did too)
        first, skip = restart(self._skip + self._own, self.views, self.spread, None)
        return {"read_state": self._state.advance(first).to_json(), "view_skip": skip, **views}

    def _view_order(self) -> str:
        mirror = " mirror_views=True" if self.mirror else ""
        return f"view_spread={self.spread or 'together'} views={self.views}{mirror}"

    def load_state_dict(self, state_dict: dict) -> None:
        """Continues the read ``state_dict`` saved (any worker count)."""
        if not isinstance(state_dict, dict) or "read_state" not in state_dict:
            got = "no read_state" if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(
                f"not a NumpyReader state ({got}): load_state_dict takes a dict as "
                "state_dict() gives it"
            )
        saved = ReadState.from_json(state_dict["read_state"])
        if saved.skips and self.spread is not None:
            raise ValueError(
                "the state skips steps: with views spread a step is one view of a batch of "
                "images, which is not skipped alone; skip with views together"
            )
        order, mine = state_dict.get("view_order"), self._view_order()
        if order is not None and order != mine:
            if not isinstance(order, str) or not all("=" in p for p in order.split()):
                raise ValueError(f"view_order {order!r}: give it as state_dict() gave it")
            raise ValueError(
                f"the state was saved reading other views ({changes(order, mine)}): some "
                "views would be sent twice, others never; pass the views and view_spread "
                "of the saved run, or start a new read"
            )
        skip = state_dict.get("view_skip", 0)
        most = 0 if self.spread is None else skip_limit(self.views, self.spread)
        if not isinstance(skip, int) or isinstance(skip, bool) or not 0 <= skip <= most:
            raise ValueError(
                f"view_skip {skip!r}: a state of this read (views={self.views}, "
                f"view_spread={self.spread or 'together'}) has a whole number at most {most}; "
                "resume a state as state_dict() gave it, with the same views and view_spread"
            )
        handed = state_dict.get("view_handover")
        if "view_handover" in state_dict and (handed is None or not skip):
            raise ValueError(
                f"view_handover {handed!r} with view_skip {skip!r}: a state saved while "
                "handed-over views were sent has both, as state_dict() gave them"
            )
        workers = self._args[3].workers()[0]
        self._handover = None
        if skip and (handed is not None or saved.num_workers not in (None, workers)):
            # the own read starts at the first block the old workers had not opened
            opened = saved.advance(started(skip, self.views, self.spread))
            self._source = RecordSource(*self._args, opened)
            self._handover = _Handover(self, saved, skip, handed)
        else:
            self._source = RecordSource(*self._args, saved)
        self._state, self._consumed, self._own = self._source.read.state, 0, 0
        self._skip = skip if self._handover is None else self._handover.own_before
        self._blocks = _blocks(self._source)

    def deal(self, every: int, first: int) -> None:
        """Yields only batches ``first, first + every, ...`` of the read (a DataLoader
        worker's share), reading only their records; views together only."""
        if self.spread is not None and every > 1:
            raise ValueError("views spread (view_spread=) are not dealt to DataLoader workers")
        self._source.deal(every, first)

    def __len__(self) -> int:
        if self.spread is None:
            return len(self._source)
        own = max(len(self._source) * self.views - self._skip, 0)
        hand = self._handover
        if hand is None:
            return own
        rest = hand.plan[hand.start :]
        return len(rest) + max(own - rest.count("own"), 0)

    def _preprocess(self, processes: int) -> Preprocess:
        o = self.options
        return Preprocess(
            self.transform,
            processes,
            o.channels,
            o.image_size,
            self._state.seed,
            self.views,
            o.augment(self.mirror),
        )

    def __iter__(self):
        preprocess = self._preprocess(self.num_processes)
        self._consumed = self._own = 0
        hand = self._handover
        batches = iter(self._source)
        if hand is not None:  # the owed views' blocks first, then the own read
            batches = itertools.chain(hand.blocks(), batches)
        outputs = preprocess.map(batches)
        if hand is not None:
            outputs = hand.merge(outputs, self._spread)
        elif self.spread is not None:
            outputs = self._counted(self._spread(outputs, self._skip))
        for batch in outputs:
            self._consumed += 1
            self.decoded = preprocess.decoded
            yield batch

    def _filler(self) -> dict:
        """One view of a batch of padding rows (the first record of the worker's first
        shard, masked), decoded and transformed here: the shape of padding when no
        batch has gone out to take it from."""
        filler = self._preprocess(0).map(iter([self._source.padding()]))
        return _rows(next(filler), 0, self.views)

    def _counted(self, own):
        for batch in own:
            self._own += 1
            yield batch

    def _spread(self, outputs, skip: int):
        """Each block's batch of views split into one batch a view, in the rounds'
        order, from output ``skip`` on; the views of at most ``(views - 1) *
        view_spread`` blocks wait."""
        held: dict[int, list] = {}
        made = 0
        for number, (block, view) in enumerate(rounds(self.views, self.spread, self._blocks)):
            while block >= made:
                try:
                    out = next(outputs)
                except StopIteration:
                    return
                held[made] = [_rows(out, v, self.views) for v in range(self.views)]
                made += 1
            batch = held[block][view]
            if view == self.views - 1:  # an image's views go out in view order
                del held[block]
            if number >= skip:
                yield batch


class _Handover:
    """A state saved between the views of its images, resumed by another worker count:
    this worker's share of the views the old workers still owed (``views.handover``),
    merged with its own read (``reader/order/views.py``)."""

    def __init__(self, reader: NumpyReader, saved: ReadState, skip: int, handed):
        data_dir, split, records, options = reader._args
        workers, index = options.workers()
        if handed is not None:
            if (
                not isinstance(handed, (list, tuple))
                or len(handed) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in handed)
                or handed[0] < 1
                or handed[1] < 0
            ):
                raise ValueError(
                    f"view_handover must be [workers >= 1, batches >= 0], got {handed!r}"
                )
            if saved.num_workers is None:
                raise ValueError(
                    "view_handover with a read_state that names no num_workers: resume "
                    "the state as state_dict() gave it"
                )
            if handed[0] != workers:
                raise ValueError(
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
            )
            for w in range(old)
        ]
        sizes = [_blocks(lane) for lane in self.lanes]
        self.views, self.saved, self.skip = reader.views, saved, skip
        _, self.plan = handover(
            reader.views, reader.spread, skip, sizes, workers, index, _fewest(reader)
        )
        self.start = 0 if handed is None else handed[1]
        if self.start > len(self.plan):
            raise ValueError(
                f"view_handover {handed!r}: the handover of this state is {len(self.plan)} "
                "batches long"
            )
        self.own_before = self.plan[: self.start].count("own")
        self.reader = reader
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

    def merge(self, outputs, spread):
        """This worker's batches: the stretch of the handover (owed views, its own read,
        padding), then its own read."""
        reader, held, pulled = self.reader, {}, 0

        def pull(upto: int) -> None:
            nonlocal pulled
            while pulled < upto:
                held[self.needed[pulled]] = next(outputs)
                pulled += 1

        def own_outputs():
            pull(len(self.needed))  # the own read comes after the owed blocks
            yield from outputs

        own = reader._counted(spread(own_outputs(), reader._skip))
        index = {block: i for i, block in enumerate(self.needed)}

        def like() -> dict:  # a batch to shape padding after, before any went out
            if self.needed:
                pull(1)
                return _rows(held[self.needed[0]], 0, self.views)
            return reader._filler()

        last = None
        for step in range(self.start, len(self.plan)):
            item = self.plan[step]
            batch = None
            if isinstance(item, tuple):
                w, block, view = item
                pull(index[(w, block)] + 1)
                batch = _rows(held[(w, block)], view, self.views)
                if self.last[(w, block)] == step:
                    del held[(w, block)]
            elif item == "own":
                batch = next(own, None)
            if batch is None:  # padding; or the own read ended within the stretch
                batch = _padding(last if last is not None else like())
            last = batch
            yield batch
        yield from own


def _fewest(reader: NumpyReader) -> int | None:
    """The fewest outputs any worker's own read has (None: endless, or unknown)."""
    read = reader._source.read
    lefts = read.sources[0].share.lefts if len(read.sources) == 1 else None
    if lefts is None:
        return None
    o, records = read.options, reader._args[2]
    batches = (
        remaining(n, max(lefts), records, o.pad_final_batch, o.drop_remainder) for n in lefts
    )
    return min(n for n, _ in batches) * reader.views


def _blocks(source: RecordSource) -> int | None:
    """The batches of images a read has (None: an endless read)."""
    try:
        return len(source)
    except TypeError:
        return None


def _padding(like: dict) -> dict:
    """A batch of padding rows (``mask`` False, key empty, label 0) shaped as ``like``
    (its own copies)."""
    out = {k: v.copy() if isinstance(v, np.ndarray) else list(v) for k, v in like.items()}
    out["mask"] = np.zeros_like(like["mask"])
    out["key"] = [""] * len(like["key"])
    if isinstance(like.get("label"), np.ndarray):
        out["label"] = np.zeros_like(like["label"])
    return out


def _rows(out: dict, view: int, views: int) -> dict:
    """The rows of one view of a batch whose rows are images x views."""
    return {
        name: np.ascontiguousarray(value[view::views])
        if isinstance(value, np.ndarray)
        else value[view::views]
        for name, value in out.items()
    }
