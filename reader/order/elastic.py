"""Elastic resume: what the old workers left of the epochs they had started, and who of
the new workers reads it (docs/design.md, "Elastic resume"). Plain numpy, no TensorFlow.

A :class:`Position` says where N workers stand with a few integers; ``pending``
computes, from every old worker's read order (``reader.plan``), the records
they had not read yet (P, merged round-robin); new worker j of M reads
``P[j::M]`` first (its **lead**), then its own order from epoch ``top + 1``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from reader.plan import ReadPlan


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
