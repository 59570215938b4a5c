"""Elastic resume: what the old workers left of the epochs they had started, and who of
the new workers reads it (docs/design.md, "Elastic resume"). Plain numpy, no TensorFlow.

A :class:`Position` says where N workers stand with a few integers; ``pending``
computes, from every old worker's read order (``reader.order.plan``), the records
they had not read yet (P, merged round-robin); new worker j of M reads
``P[j::M]`` first (its **lead**), then its own order from epoch ``top + 1``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from reader.order.deal import split_ids
from reader.order.plan import ReadPlan
from schemas.errors import InvalidValueError


@dataclasses.dataclass(frozen=True)
class Position:
    """Where ``workers`` workers stand: worker w has consumed
    ``epoch * n_w + consumed - shift(w)`` records of its own order, counted from epoch 0.

    ``consumed`` is step x batch size (every worker took the same steps);
    ``q``, ``r``: the lead the workers read first (``q`` records, one more for
    workers below ``r``), which does not count in their own order.
    """

    workers: int
    epoch: int
    consumed: int
    q: int = 0
    r: int = 0

    def shift(self, w: int) -> int:
        return self.q + (1 if w < self.r else 0)

    def of(self, w: int, n_w: int) -> int:
        """Records worker ``w`` (``n_w`` examples an epoch) has read of its own order."""
        return self.epoch * n_w + max(self.consumed - self.shift(w), 0)


@dataclasses.dataclass(frozen=True)
class Pending:
    """What the old workers left: split-wide record ids (``P``) and their epochs, merged
    round-robin; ``top``: the last epoch any old worker had started."""

    ids: np.ndarray
    epochs: np.ndarray
    top: int

    def lead(self, offset: int, workers: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, epochs) of new worker ``index`` of ``workers``: ``P[offset:][index::workers]``."""
        return self.ids[offset:][index::workers], self.epochs[offset:][index::workers]

    def shares(self, offset: int, workers: int) -> tuple[int, int]:
        """(q, r): every new worker's lead holds q records, those below r one more."""
        return divmod(len(self.ids) - offset, workers)


def pending(
    position: Position,
    plans: list[ReadPlan],
    to_split: list[np.ndarray],
    epochs: int | None = None,
) -> Pending:
    """The records the old workers had not read of the epochs they had started.

    Args:
        position: where they stand.
        plans: every old worker's read order, worker w at ``plans[w]``.
        to_split: per old worker, its record ids (``ReadPlan.epoch_order``'s) mapped to
            split-wide ids: ``to_split[w][local_id]``.
        epochs: the read's epochs (None: endless). A worker that has read all of them
            is done (padding, or waiting for the others), not into an epoch past the end.
    """
    at = [divmod(position.of(w, p.size), p.size) for w, p in enumerate(plans)]
    if epochs is not None:
        at = [(e, start) if e < epochs else (epochs, 0) for e, start in at]
    top = max(e for e, _ in at)
    if epochs is not None:
        top = min(top, epochs - 1)
    tails, tail_epochs = [], []
    for w, (plan, (epoch, start)) in enumerate(zip(plans, at)):
        parts = [
            to_split[w][plan.epoch_order(e)[start if e == epoch else 0 :]]
            for e in range(epoch, top + 1)
        ]
        sizes = [len(part) for part in parts]
        tails.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
        tail_epochs.append(np.repeat(np.arange(epoch, top + 1, dtype=np.int64), sizes))
    return Pending(*_round_robin(tails, tail_epochs), top)


def _round_robin(tails: list[np.ndarray], epochs: list[np.ndarray]):
    """The first record of every tail, then the second, ...; exhausted tails drop out."""
    rank = np.concatenate([np.arange(len(t)) for t in tails])
    which = np.concatenate([np.full(len(t), w) for w, t in enumerate(tails)])
    order = np.lexsort((which, rank))
    return np.concatenate(tails)[order].astype(np.int64), np.concatenate(epochs)[order]


@dataclasses.dataclass(frozen=True)
class Segment:
    """What the workers of this read go through: a lead (``pending`` from ``offset``,
    dealt over ``workers``), then their own order from ``first_epoch``; ``consumed``
    records of it are behind every worker. ``elastic``: the state's record of the lead;
    ``saved``: resumed from a state (a worker past its end has finished, not erred)."""

    first_epoch: int
    consumed: int
    pending: Pending | None = None
    offset: int = 0
    workers: int = 1
    elastic: tuple | None = None
    saved: bool = False

    @classmethod
    def plain(cls, start_epoch: int, start_records: int, workers: int) -> Segment:
        """A plain start at ``start_records`` of epoch ``start_epoch``, no lead."""
        return cls(start_epoch, start_records, workers=workers)

    @classmethod
    def resumed(
        cls,
        at: Position,
        elastic: tuple | None,
        workers: int,
        counts,
        plan_of,
        epochs: int | None,
        unit: int = 1,
    ) -> Segment:
        """Where a saved read stands (``at``: the saving workers, their epoch and records
        consumed; ``elastic``: their own lead, if any), for ``workers`` workers over
        shards of ``counts`` examples (docs/design.md, "Elastic resume"): the same
        workers go on; others first read what the old ones left (of ``epochs``, None:
        endless). ``plan_of(workers, w)``: the read plan of worker w of that many.

        Raises ValueError for a state every saving worker of which was a whole batch
        (``unit`` records) past the end of its read: one no read of these gives."""

        def left_by(where: Position) -> Pending:
            plans = [plan_of(where.workers, w) for w in range(where.workers)]
            ids = [split_ids(counts, where.workers, w) for w in range(where.workers)]
            return pending(where, plans, ids, epochs)

        saved, consumed = at.workers, at.consumed
        leads = [0] * saved  # each saving worker's lead, read before its own order
        if elastic is not None:
            *before, offset = elastic
            lead = left_by(Position(*before))
            q, r = lead.shares(offset, saved)
            leads = [q + (w < r) for w in range(saved)]
        if epochs is not None:
            sizes = [plan_of(saved, w).size for w in range(saved)]
            left = max(n + (epochs - at.epoch) * s for n, s in zip(leads, sizes)) - consumed
            if left <= -unit:
                raise InvalidValueError(
                    f"the state is past the end of this read (epoch {at.epoch}, {consumed} "
                    f"records a worker, of {epochs} epochs): it was saved by another read, "
                    "or edited; resume the state a run of this read saved"
                )
        if elastic is None:
            if saved == workers:
                return cls(at.epoch, consumed, workers=workers, saved=True)
        else:
            if saved == workers:
                return cls(at.epoch, consumed, lead, offset, workers, elastic, True)
            if consumed * saved < len(lead.ids) - offset:  # during the lead: a suffix of it
                offset += consumed * saved
                return cls(at.epoch, 0, lead, offset, workers, (*before, offset), True)
            at = Position(saved, at.epoch, consumed, q, r)
        lead = left_by(at)
        record = (at.workers, at.epoch, at.consumed, at.q, at.r, 0)
        return cls(lead.top + 1, 0, lead, 0, workers, record, True)

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
