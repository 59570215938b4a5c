"""A read's batches moved to a device ahead of their use: ``TorchReader(device=...)``
(``reader.routes.torch_device``) and ``NumpyReader(device=...)`` for JAX
(``reader.routes.jax_device``).

Each batch is put on the device ``AHEAD`` batches before the loop takes it, and its host
batch (on the Python route, views of a shared memory block the workers wrote:
``reader.routes.shared_blocks``) is held until its copy finished, so a block goes back
to the workers only once nothing reads it. The reader's state counts the batches the
loop took, not those moved ahead: each batch carries the state after it (``state``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from reader.compat import mp as compat_mp

AHEAD = 2  # batches put on the device before the one the loop takes


class Move(Protocol):
    """How batches reach one device."""

    def check(self) -> None:
        """Raises where this process cannot move batches (a DataLoader worker)."""

    def session(self) -> AbstractContextManager[Callable]:
        """A pass's ``put(batch) -> (moved, wait)``: ``moved`` the batch on the device,
        its copy perhaps in flight; ``wait()`` returns once it finished."""


class Ahead:
    """Moves a read's batches with ``move``, ``ahead`` batches before they are taken;
    ``state``: the read's state after the last batch taken (None: none taken this pass,
    the read's own state stands)."""

    def __init__(self, move: Move, ahead: int = AHEAD):
        self.move, self.ahead = move, ahead
        self.state = None

    def batches(self, source, standing: Callable[[], dict]):
        """``source``'s batches on the device; ``standing()``: the read's state after the
        batches ``source`` gave so far, asked as each is pulled."""
        self.move.check()
        self.state = None
        return compat_mp.closed_at_exit(self._moved(source, standing))

    def _moved(self, source, standing):
        pending = collections.deque()  # (moved, wait, host batch, state after it)
        with self.move.session() as put:
            try:
                for batch in source:
                    pending.append((*put(batch), batch, standing()))
                    del batch  # held in ``pending`` only: dropped once its copy finished
                    if len(pending) > self.ahead:
                        yield self._taken(pending.popleft())
                while pending:
                    yield self._taken(pending.popleft())
            finally:  # left early (a break, an error): no block goes back, or is unmapped
                # by the read's end, while a copy from it may still be in flight
                for _, wait, _, _ in pending:
                    wait()

    def _taken(self, item):
        moved, wait, host, state = item
        wait()  # copied: the host batch's block may go back to the workers
        del host
        self.state = state
        return moved


class AheadRead:
    """A face's read (``batches(shaped)``, ``state_dict()``, ``load_state_dict()``,
    ``len()``) whose batches ``move`` puts on a device ahead of the loop."""

    def __init__(self, read, move: Move):
        self.read, self.ahead = read, Ahead(move)

    def batches(self, shaped):
        return self.ahead.batches(self.read.batches(shaped), self.read.state_dict)

    def state_dict(self) -> dict:
        if self.ahead.state is not None:
            return self.ahead.state  # the batches the loop took, not those moved ahead
        return self.read.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.read.load_state_dict(state_dict)
        self.ahead.state = None

    def __len__(self) -> int:
        return len(self.read)
