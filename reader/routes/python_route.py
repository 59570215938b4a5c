"""The Python route: a read's records decoded once each (libjpeg-turbo or Pillow,
``reader/decode/pixels.py``) in worker processes, given to a Python ``transform`` once a
view, and batched (views together, or spread batches apart).

The spine's Python stream, which ``NumpyReader``, ``TorchReader(backend="python")``
and ``make_dataset(transform=...)`` stand on: records from
:class:`reader.records.source.RecordSource`, decoded and transformed by
:class:`reader.routes.preprocess.Preprocess`, views handed over across an elastic resume
by :class:`reader.routes.view_handover.ViewHandover`.
"""

from __future__ import annotations

import itertools
import warnings

from reader.front.read import check_sized, check_state, merge, start_state
from reader.order.views import check_blocks, checked_spread, restart, rounds, skip_limit, started
from reader.records.example_batches import python_parser
from reader.records.source import RecordSource
from reader.routes.preprocess import Preprocess, check_transform, default_processes
from reader.routes.view_handover import ViewHandover, block_count, rows
from reader.values.option_groups import GROUPS, PythonStage, refuse_untaken
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState, changes
from schemas.errors import InvalidValueError


class PythonRoute:
    """Batches of one split as dicts of numpy arrays (``reader.NumpyReader``'s
    arguments, which it documents); ``len()`` is the number of batches."""

    # the groups of options taken (reader/values/option_groups.py); a face over the route that
    # takes fewer says so, and what to do instead of each group it does not take
    takes = frozenset(GROUPS)
    face, instead = "the Python route", {}

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
        stage: PythonStage | None = None,
        **overrides,
    ):
        options = merge(options, overrides)
        refuse_untaken(options, self.takes, self.face, self.instead)
        check_state(state)
        if not options.decode:
            raise InvalidValueError(
                "NumpyReader decodes every image (a transform is given its pixels), and "
                "so do make_dataset and TorchReader through it (given transform=, views=, "
                'num_processes= or on_error="skip"): decode=False is not an option here; '
                "read the encoded bytes with reader.make_dataset(decode=False) without those"
            )
        if stage is None:  # the flat keywords, as users type them (checked there)
            stage = PythonStage(transform, views, view_spread, mirror_views, num_processes)
        self.stage = stage
        transform, views = stage.transform, stage.views
        self.spread = checked_spread(views, stage.view_spread, stage.mirror_views, batch_size)
        together = self.spread is None
        num_processes = stage.num_processes
        cores = default_processes()
        if num_processes is None:
            num_processes = cores
        elif num_processes > cores:  # as DataLoader warns of more workers than cores
            warnings.warn(
                f"num_processes={num_processes} starts {num_processes} worker processes "
                f"on {cores} cores: they take turns on the cores and each holds its own "
                "memory; num_processes=None starts one a core",
                UserWarning,
                stacklevel=3,
            )
        if num_processes:
            check_transform(transform)  # refused now, not in a process later
        self.transform, self.views, self.num_processes = transform, views, num_processes
        self.mirror = bool(stage.mirror_views)
        records = batch_size // views if together else batch_size  # a batch of the read
        started = state is None  # the whole read: the spread is checked against it
        if started:  # the read as a state from its start: state_dict() says where
            state, options = start_state(options, split, records)
        self.args = (data_dir, split, records, options)
        self.options = options
        self.decoded = 0  # images decoded by the last iteration (once each, any views)
        self.load_state_dict({"read_state": state.to_json()})
        # records that are not images: parsed by the spec, nothing decoded (else None)
        self._parse = python_parser(self.source.read, transform, views)
        if transform is None:  # the decoded images themselves are batched
            check_sized(options, batch_size, self.source.read)
        if started:
            check_blocks(self.spread, self._blocks)

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
                "view_handover": [self.args[3].workers()[0], hand.start + self._consumed],
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
            raise InvalidValueError(
                f"not a NumpyReader state ({got}): load_state_dict takes a dict as "
                "state_dict() gives it"
            )
        saved = ReadState.from_json(state_dict["read_state"])
        if saved.skips and self.spread is not None:
            raise InvalidValueError(
                "the state skips steps: with views spread a step is one view of a batch of "
                "images, which is not skipped alone; skip with views together"
            )
        order, mine = state_dict.get("view_order"), self._view_order()
        if order is not None and order != mine:
            if not isinstance(order, str) or not all("=" in p for p in order.split()):
                raise InvalidValueError(f"view_order {order!r}: give it as state_dict() gave it")
            raise InvalidValueError(
                f"the state was saved reading other views ({changes(order, mine)}): some "
                "views would be sent twice, others never; pass the views and view_spread "
                "of the saved run, or start a new read"
            )
        skip = state_dict.get("view_skip", 0)
        most = 0 if self.spread is None else skip_limit(self.views, self.spread)
        if not isinstance(skip, int) or isinstance(skip, bool) or not 0 <= skip <= most:
            raise InvalidValueError(
                f"view_skip {skip!r}: a state of this read (views={self.views}, "
                f"view_spread={self.spread or 'together'}) has a whole number at most {most}; "
                "resume a state as state_dict() gave it, with the same views and view_spread"
            )
        handed = state_dict.get("view_handover")
        if "view_handover" in state_dict and (handed is None or not skip):
            raise InvalidValueError(
                f"view_handover {handed!r} with view_skip {skip!r}: a state saved while "
                "handed-over views were sent has both, as state_dict() gave them"
            )
        workers = self.args[3].workers()[0]
        self._handover = None
        if skip and (handed is not None or saved.num_workers not in (None, workers)):
            # the own read starts at the first block the old workers had not opened
            opened = saved.advance(started(skip, self.views, self.spread))
            self.source = RecordSource(*self.args, opened, placed=True)
            self._handover = ViewHandover(self, saved, skip, handed)
        else:
            self.source = RecordSource(*self.args, saved, placed=True)
        self._state, self._consumed, self._own = self.source.read.state, 0, 0
        self._skip = skip if self._handover is None else self._handover.own_before
        self._blocks = block_count(self.source)

    def deal(self, every: int, first: int) -> None:
        """Yields only batches ``first, first + every, ...`` of the read (a DataLoader
        worker's share), reading only their records; views together only."""
        if self.spread is not None and every > 1:
            raise InvalidValueError(
                "views spread (view_spread=) are not dealt to DataLoader workers"
            )
        self.source.deal(every, first)

    def __len__(self) -> int:
        if self.spread is None:
            return len(self.source)
        own = max(len(self.source) * self.views - self._skip, 0)
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
            skip=self.source.skip if o.on_error == "skip" else None,
        )

    def __iter__(self):
        preprocess = self._preprocess(self.num_processes)
        # a record that fails to parse goes to the ledger with its batch, after the
        # images that fail to decode before it: the same lines for any processes
        self.source.deferred = self._parse is None
        self._consumed = self._own = 0
        hand = self._handover
        batches = iter(self.source)
        if hand is not None:  # the owed views' blocks first, then the own read
            batches = itertools.chain(hand.blocks(), batches)
        outputs = preprocess.map(batches) if self._parse is None else map(self._parse, batches)
        if hand is not None:
            outputs = hand.merge(outputs, self._own_batches)
        elif self.spread is not None:
            outputs = self._own_batches(outputs)
        for batch in outputs:
            self._consumed += 1
            self.decoded = preprocess.decoded
            yield batch

    def filler(self) -> dict:
        """One view of a batch of padding rows (the first record of the worker's first
        shard, masked), decoded and transformed here: the shape of padding when no
        batch has gone out to take it from."""
        filler = self._preprocess(0).map(iter([self.source.padding()]))
        return rows(next(filler), 0, self.views)

    def _own_batches(self, outputs):
        """This worker's own read's batches, spread, from output ``skip`` on, counted."""
        for batch in self._spread(outputs, self._skip):
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
                held[made] = [rows(out, v, self.views) for v in range(self.views)]
                made += 1
            batch = held[block][view]
            if view == self.views - 1:  # an image's views go out in view order
                del held[block]
            if number >= skip:
                yield batch
