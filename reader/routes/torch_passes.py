"""A ``TorchReader``'s read on its three backends (views together): which state each
pass reads from, and where the pass under way stands; the one state ``state_dict()``
gives and ``load_state_dict()`` takes.

A pass is one ``iter()`` of the reader. The read from its beginning is where every pass
starts, as an uninterrupted run's passes do. A state loaded (``load_state_dict``,
``state=``) in the process that iterates is where its next pass starts, that pass only,
so a resumed run's later passes are the uninterrupted run's: the training process
(``num_workers=0``, torchdata's ``StatefulDataLoader`` with 0 workers too), and a
``StatefulDataLoader`` worker, which the loader gives its own state back (a persistent
one's later passes read from the beginning; a state saved after a pass ended gives a
whole pass, as with new workers).

A plain ``DataLoader``'s workers copy the reader (fork, or a pickle): one given a
state that its process did not iterate yet holds it, so every pass of such workers,
persistent or not, reads from it (tests/test_dataloader_workers.py pins it for
persistent workers); the training process's ``state_dict()`` counts their batches
from it.
"""

from __future__ import annotations

import dataclasses
import os

from reader.front.read import resolve, start_state
from reader.values.state import ReadState

_WORKER_FIRST = "worker_first"  # a DataLoader worker's state: its next batch


@dataclasses.dataclass
class Loaded:
    """A loaded state not yet read: its read (``reader.front.read.resolve``'s), the first
    batch of a ``StatefulDataLoader`` worker's state, and the process that loaded it."""

    read: object
    worker_first: int | None
    pid: int


class Passes:
    """The beginning of a read of ``unit`` records a batch, the state loaded for its
    next pass, and the pass under way: its read (``sources``, ``len``), the state it
    started from (``state``), the batches of it consumed, and a ``StatefulDataLoader``
    worker's first batch (``worker_first``; None: the worker's id)."""

    def __init__(self, data_dir, split: str, unit: int, options, state: ReadState | None):
        """``state`` None: the read as a state from its start (``options`` given a seed
        where they need one: ``self.options``), else ``state`` is loaded."""
        if state is None:
            state, options = start_state(options, split, unit)
            self.beginning = state
        else:
            self.beginning = ReadState(state.seed, unit)
        self.args, self.options = (data_dir, split, unit, options), options
        self.loaded: Loaded | None = None
        self._beginning = None  # (beginning, its read), resolved once for each beginning
        self.load({"read_state": state.to_json()})

    def load(self, state_dict: dict) -> None:
        """The next pass reads ``state_dict``'s state (the options and files checked, and
        the batch count): the beginning keeps its seed and exclusions (a run resumed
        reads as the one that saved it), from the start."""
        read = resolve(*self.args, ReadState.from_json(state_dict["read_state"]))
        state = read.state
        self.beginning = dataclasses.replace(
            self.beginning, seed=state.seed, excluded=state.excluded
        )
        self.loaded = Loaded(read, worker_first(state_dict), os.getpid())
        self._pass(read, worker_first(state_dict))

    def start(self) -> None:
        """A pass starts: from the state loaded for it, else from the beginning."""
        loaded = self.loaded
        if loaded is None:
            self._pass(self._beginning_read(), None)
            return
        if loaded.pid == os.getpid():
            self.loaded = None  # loaded here: this pass only
        self._pass(loaded.read, loaded.worker_first)

    def _pass(self, read, first: int | None) -> None:
        self.sources, self.len = read.sources, read.yields
        self.state, self.consumed, self.worker_first = read.state, 0, first

    def _beginning_read(self):
        if self._beginning is None or self._beginning[0] != self.beginning:
            self._beginning = (self.beginning, resolve(*self.args, self.beginning))
        return self._beginning[1]

    def first_dealt(self, worker: int) -> int:
        """DataLoader worker ``worker``'s first batch of the read from ``self.state``."""
        return worker if self.worker_first is None else self.worker_first

    def standing(self, received: int | None = None) -> ReadState:
        """Where the read stands: the pass's state advanced by the batches consumed; in
        the training process, given the batches DataLoader workers sent that reached it
        (``received``), the state the workers' passes read from (the one they copied,
        else the beginning) advanced by those."""
        if received is None:
            return self.state.advance(self.consumed)
        copied = self._beginning_read() if self.loaded is None else self.loaded.read
        return copied.state.advance(received)


def worker_state(read_state: str, first: int) -> dict:
    """A DataLoader worker's state, as torchdata's ``StatefulDataLoader`` keeps it for each
    worker with the batches it yielded: where the worker's read stands (``read_state``,
    ReadState JSON), and its next batch counted from there (``first``, modulo the
    worker count)."""
    return {"read_state": read_state, _WORKER_FIRST: first}


def worker_first(state: dict) -> int | None:
    """The next batch of a worker's state from ``worker_state``; None for a reader's."""
    return state.get(_WORKER_FIRST)
