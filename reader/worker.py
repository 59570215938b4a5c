"""What one worker reads of a split, and in which order: shared by every reader.

The tf.data pipeline (``reader.pipeline``), the DALI pipeline and the PyTorch
iterable (``reader.dali``, ``reader.torch``) build a :class:`WorkerRead` from
the same options, so they share the file deal, the example counts, the batch
counts, the padding and the read order (``reader.plan``). No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import secrets

import numpy as np

from reader.elastic import Pending, Position, pending
from reader.info import load_index, split_fingerprint, split_shards
from reader.options import DEFAULT_CYCLE, ReadOptions
from reader.plan import ReadPlan
from reader.state import ReadState
from schemas.info import DatasetError

log = logging.getLogger(__name__)


def worker_plan(shards: list[dict], num_workers: int, worker_index: int):
    """Which files a worker reads, and how many examples it gets.

    Files are dealt round-robin (disjoint). With fewer files than workers,
    every worker reads all files and keeps every num_workers-th record.

    Returns:
        (files, examples of this worker, record-level stride)
    """
    if len(shards) < num_workers:
        total = sum(s["num_examples"] for s in shards)
        return shards, len(range(worker_index, total, num_workers)), num_workers
    mine = shards[worker_index::num_workers]
    return mine, sum(s["num_examples"] for s in mine), 1


def split_ids(shards: list[dict], num_workers: int, worker_index: int) -> np.ndarray:
    """Split-wide record ids (shards in their listed order) of a worker's record ids
    (``ReadPlan.epoch_order``'s): ``split_ids(...)[local_id]``."""
    counts = np.array([s["num_examples"] for s in shards], np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if len(shards) < num_workers:  # every worker numbers all the records
        return np.arange(int(counts.sum()), dtype=np.int64)
    files = np.arange(worker_index, len(shards), num_workers)
    return np.concatenate([starts[f] + np.arange(counts[f]) for f in files]).astype(np.int64)


def read_plan(shards: list[dict], num_workers: int, worker_index: int, seed, o: ReadOptions):
    """The read order of one worker (``seed`` None: unshuffled)."""
    mine, _, stride = worker_plan(shards, num_workers, worker_index)
    at_once = o.cycle_length or DEFAULT_CYCLE
    plan = ReadPlan(
        counts=[s["num_examples"] for s in mine],
        seed=seed,
        cycle=at_once,
        block=o.block_length,
        window=o.shuffle_buffer,
        stride=stride,
        offset=worker_index if stride > 1 else 0,
        # fewer shards than runs read at once: cut each into more runs (reader/plan.py)
        parts=-(-at_once // len(mine)),
    )
    return dataclasses.replace(plan, cycle=min(at_once, plan.num_runs))


@dataclasses.dataclass(frozen=True)
class WorkerRead:
    """One worker's read of a split (see :meth:`of`).

    The worker's stream is its **lead** (records left by the workers of a run it
    resumes with another worker count; docs/design.md, "Elastic resume"), then its
    own order from epoch ``first_epoch`` on; ``consumed`` records of that stream are
    behind it.

    Attributes:
        shards: the worker's files, [{path, num_examples, num_bytes, index, table}]
            (``table``: the checked DALI index, [[offset, size]]; None for gzip).
        num_examples: examples the worker reads an epoch.
        shuffle, seed: whether it shuffles, and the seed (drawn when none was given).
        plan: the read order.
        lead: (split-wide record ids, their epochs) of the lead not yet read; None:
            no lead. ``split``: every shard of the split, with its table, to fetch
            them (None without a lead).
        start: the first record of its own order read, counted over all epochs.
        remaining: elements yielded from here on (batches, or examples without a
            batch size); None: endless.
        real_batches: with ``pad_final_batch``, batches holding real examples.
        state: the :class:`ReadState` to advance by the batches consumed (None
            when the read was not given one).
        lefts: records every worker of this read has left (None: endless).
    """

    shards: list[dict]
    num_examples: int
    shuffle: bool
    seed: int | None
    plan: ReadPlan
    lead: tuple | None
    split: list[dict] | None
    start: int
    remaining: int | None
    real_batches: int
    state: ReadState | None = None
    lefts: tuple | None = None

    @classmethod
    def of(
        cls, info: dict, data_dir: str, split: str, batch_size, o: ReadOptions, state=None
    ) -> WorkerRead:
        """Checks the options and the split's shards; deals the files; plans the order;
        with a :class:`ReadState`, resumes it (with any worker count)."""
        shards = split_shards(info, data_dir, split)
        shuffle = o.shuffles(split)
        _check(o, batch_size, shuffle)
        if not shards:
            raise DatasetError(f"split {split!r} of {data_dir} has no examples")
        n_workers, index = o.workers()
        _warn_uneven(split, len(shards), n_workers)
        if state is not None:
            seed = _check_resumable(o, state, info, split, batch_size)
        else:
            seed = o.seed
            if seed is None and (shuffle or o.random_crop):
                seed = secrets.randbelow(2**31 - 1)  # a fresh one
        order_seed = seed if shuffle else None
        plans = {}

        def plan_of(workers: int, w: int) -> ReadPlan:
            if (workers, w) not in plans:
                plans[workers, w] = read_plan(shards, workers, w, order_seed, o)
            return plans[workers, w]

        unit = batch_size or 1
        segment = _Segment.plain(o, unit, n_workers)
        if state is not None:
            segment = _Segment.resumed(state, shards, n_workers, plan_of, o.epochs)
        mine, num_examples, _ = worker_plan(shards, n_workers, index)
        # the count read is the count listed: each shard's index describes it exactly
        mine = [{**s, "table": load_index(s)} for s in mine]
        lead = segment.lead(index)
        table = None
        if lead is not None and len(lead[0]):
            table = [{**s, "table": load_index(s)} for s in shards]
            if any(s["table"] is None for s in table):
                raise DatasetError(
                    f"{data_dir} has gzip shards: resuming with another worker count fetches "
                    "records by the DALI index, which only uncompressed shards have; convert "
                    "without --compression (or resume with the saved worker count)"
                )
        sizes = [plan_of(n_workers, w).size for w in range(n_workers)]
        left = [segment.left(w, sizes[w], o.epochs) for w in range(n_workers)]
        most = None if o.epochs is None else max(left)
        remaining, real = _remaining(o, batch_size, left[index], most)
        resumed = None
        if state is not None:
            fingerprint = split_fingerprint(info, split)
            resumed = segment.state(state, seed, unit, n_workers, fingerprint, o.order(split))
        if lead is not None:
            skip = segment.skipped(index)
            lead = (lead[0][skip:], lead[1][skip:])
        return cls(
            mine,
            num_examples,
            shuffle,
            seed,
            plan_of(n_workers, index),
            lead,
            table,
            segment.start(index, sizes[index]),
            remaining,
            real,
            resumed,
            None if o.epochs is None else tuple(left),
        )

    def skip(self, k: int) -> WorkerRead:
        """The same read ``k`` records further on (a read of single examples, unpadded:
        a source of a mixture, ``reader.mix``)."""
        lead, start = self.lead, self.start
        if lead is not None:
            given = min(k, len(lead[0]))
            lead, start = (lead[0][given:], lead[1][given:]), start + k - given
        else:
            start += k
        remaining = None if self.remaining is None else self.remaining - k
        state = None if self.state is None else self.state.advance(k)
        return dataclasses.replace(self, lead=lead, start=start, remaining=remaining, state=state)


def _warn_uneven(split: str, n_files: int, num_workers: int) -> None:
    if n_files < num_workers:
        log.warning(
            "split %s has %d shards for %d workers: every worker reads every shard "
            "and keeps 1 record in %d; convert with --shard_multiple %d to read "
            "disjoint files",
            split,
            n_files,
            num_workers,
            num_workers,
            num_workers,
        )
    elif n_files % num_workers:
        log.warning(
            "split %s has %d shards, not a multiple of %d workers: workers get "
            "unequal example counts; convert with --shard_multiple %d to fix it",
            split,
            n_files,
            num_workers,
            num_workers,
        )


@dataclasses.dataclass(frozen=True)
class _Segment:
    """What the workers of this read go through: a lead (``pending`` from ``offset``,
    dealt over ``workers``), then their own order from ``first_epoch``; ``consumed``
    records of it are behind every worker. ``elastic``: the state's record of the lead."""

    first_epoch: int
    consumed: int
    pending: Pending | None = None
    offset: int = 0
    workers: int = 1
    elastic: tuple | None = None
    saved: bool = False  # from a ReadState: a worker past its end has finished, not erred

    @classmethod
    def plain(cls, o: ReadOptions, unit: int, workers: int) -> _Segment:
        """``start_epoch``, ``start_step``: a plain start, no lead."""
        return cls(o.start_epoch, o.start_step * unit, workers=workers)

    @classmethod
    def resumed(cls, state, shards: list[dict], workers: int, plan_of, epochs) -> _Segment:
        """Where a saved read stands, for ``workers`` workers (docs/design.md, "Elastic
        resume"): the same workers go on; others first read what the old ones left
        (of ``epochs``, None: endless)."""

        def left_by(at: Position) -> Pending:
            plans = [plan_of(at.workers, w) for w in range(at.workers)]
            ids = [split_ids(shards, at.workers, w) for w in range(at.workers)]
            return pending(at, plans, ids, epochs)

        consumed = state.step * state.batch_size
        saved = state.num_workers or workers
        if state.elastic is None:
            if saved == workers:
                return cls(state.epoch, consumed, workers=workers, saved=True)
            at = Position(saved, state.epoch, consumed)
        else:
            *before, offset = state.elastic
            lead = left_by(Position(*before))
            if saved == workers:
                return cls(state.epoch, consumed, lead, offset, workers, state.elastic, True)
            q, r = lead.shares(offset, saved)
            if consumed * saved < len(lead.ids) - offset:  # during the lead: a suffix of it
                offset += consumed * saved
                return cls(state.epoch, 0, lead, offset, workers, (*before, offset), True)
            at = Position(saved, state.epoch, consumed, q, r)
        lead = left_by(at)
        elastic = (at.workers, at.epoch, at.consumed, at.q, at.r, 0)
        return cls(lead.top + 1, 0, lead, 0, workers, elastic, True)

    def lead(self, w: int) -> tuple | None:
        """Worker ``w``'s whole lead: (split-wide ids, epochs), or None."""
        if self.pending is None:
            return None
        return self.pending.lead(self.offset, self.workers, w)

    def lead_size(self, w: int) -> int:
        if self.pending is None:
            return 0
        q, r = self.pending.shares(self.offset, self.workers)
        return q + (1 if w < r else 0)

    def skipped(self, w: int) -> int:
        """Records of worker ``w``'s lead already read."""
        return min(self.consumed, self.lead_size(w))

    def start(self, w: int, size: int) -> int:
        """The first record of worker ``w``'s own order to read, counted over all epochs."""
        return self.first_epoch * size + max(self.consumed - self.lead_size(w), 0)

    def left(self, w: int, size: int, epochs: int | None) -> int | None:
        """Records worker ``w`` (``size`` examples an epoch) has left; None: endless.
        Negative: a plain start past the end."""
        if epochs is None:
            return None
        own = epochs * size - self.start(w, size)
        if self.pending is None:
            return max(own, 0) if self.saved else own
        return self.lead_size(w) - self.skipped(w) + max(own, 0)

    def state(self, saved, seed, unit: int, workers: int, fingerprint, order):
        """The state of this read, to advance by the batches consumed."""
        if self.consumed % unit:
            raise ValueError(
                f"the state was saved after {self.consumed} records a worker (batch size "
                f"{saved.batch_size}), not a whole number of batches of {unit}: resume with "
                "a batch size that divides it, or with another worker count"
            )
        return dataclasses.replace(
            saved,
            seed=seed,
            batch_size=unit,
            epoch=self.first_epoch,
            step=self.consumed // unit,
            num_workers=workers,
            dataset=fingerprint,
            order=order,
            elastic=self.elastic,
        )


def _remaining(o: ReadOptions, batch_size, left: int | None, most: int | None):
    """(elements yielded from here on, batches holding real examples): elements are
    batches, or examples without a batch size; None: endless. ``left``: this worker's
    records left; ``most``: the most any worker has left. Batches come after the
    epochs are joined, so they run across epoch boundaries."""
    if left is None:
        return None, 0
    unit = batch_size or 1
    if o.pad_final_batch:
        # Every worker yields the same batch count (that of the worker with the
        # most records left), so collective evaluation steps never wait on one.
        elements = math.ceil(most / unit)
    else:
        elements = left // unit if o.drop_remainder else math.ceil(left / unit)
    if elements < 0:  # a start within the last partial batch is the end: 0
        raise ValueError(
            f"start_epoch {o.start_epoch}, start_step {o.start_step} is past the end of "
            f"this read ({o.epochs} epochs on this worker)"
        )
    return elements, max(math.ceil(left / unit), 0) if batch_size else 0


def _check_resumable(o: ReadOptions, state, info: dict, split: str, batch_size) -> int:
    """A state resumes only the read it was saved from (the seed, the split's shards and
    the options that shape the order); the start comes from it. Returns the seed."""
    if o.seed is not None and o.seed != state.seed:
        raise ValueError(f"the state was saved with seed {state.seed}, options give {o.seed}")
    if o.start_step or o.start_epoch:
        raise ValueError("resume takes the start from the state: leave start_step/start_epoch 0")
    state.check_same_read(split_fingerprint(info, split), o.order(split), split)
    return state.seed


def _check(o: ReadOptions, batch_size: int | None, shuffle: bool) -> None:
    """Options that only conflict given the batch size and the split's default shuffle."""
    if batch_size is not None and (
        not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool)
    ):
        raise TypeError(f"batch_size must be a whole number (int) or None, got {batch_size!r}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    if o.pad_final_batch and (batch_size is None or o.drop_remainder):
        raise ValueError("pad_final_batch needs a batch_size and drop_remainder=False")
    if o.pad_final_batch and (shuffle or o.epochs != 1 or o.start_epoch):
        raise ValueError(
            "pad_final_batch is for evaluation: use shuffle=False, epochs=1 (and start_step, "
            "not start_epoch, to resume)"
        )
    if o.decode and batch_size is not None and o.image_size is None:
        raise ValueError(
            "decoded images differ in size: give image_size=(height, width) to "
            "batch them, or batch_size=None, or decode=False"
        )
    if (o.start_step or o.start_epoch) and (shuffle or o.random_crop) and o.seed is None:
        raise ValueError(
            "start_step and start_epoch resume a seeded read: pass the seed of the run "
            "being resumed (an unseeded shuffle cannot be repeated)"
        )
