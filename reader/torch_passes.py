"""Which state each pass of a ``TorchReader`` reads from.

A pass is one ``iter()`` of the reader: in the training process, in each DataLoader
worker (a pass of a DataLoader), or in torchdata's ``StatefulDataLoader``. The read
from its beginning is where every pass starts, as an uninterrupted run's passes do; a
state loaded (``load_state_dict``, ``state=``) is where the next pass starts, that pass
only, so a resumed run's later passes are the uninterrupted run's.

The next pass takes the loaded state once, wherever it runs:

- in the process that loaded it (the training process, or a ``StatefulDataLoader``
  worker given its own state back, persistent or not): its next ``iter()``;
- in DataLoader workers forked from the training process before it iterated: the
  first pass whose workers start takes it, each of its workers, and later passes
  (new workers forked from the same reader, or the same persistent workers again)
  read from the beginning. Workers of a pass know their pass by the DataLoader
  iterator's base seed (``get_worker_info().seed - id``) and their own count of
  passes; the pass that took the state is written to memory shared with the training
  process, whose ``state_dict()`` then knows which state the batches it received
  count from.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import secrets

from reader.state import ReadState

_NONE = 0  # no pass took the loaded state yet


@dataclasses.dataclass
class Loaded:
    """A loaded state not yet read: its read (``reader.read.resolve``'s), the first
    batch of a ``StatefulDataLoader`` worker's state, and the process that loaded it."""

    read: object
    worker_first: int | None
    pid: int
    in_worker: bool


class Passes:
    """The beginning of a reader's read, and the state loaded for its next pass."""

    def __init__(self, beginning: ReadState):
        self.beginning = beginning
        self.loaded: Loaded | None = None
        self.count = 0  # passes this copy of the reader started
        # shared with the DataLoader workers: the pass that took the loaded state, and
        # the pass the workers started last
        self.taken = multiprocessing.RawValue("q", _NONE)
        self.latest = multiprocessing.RawValue("q", _NONE)

    def load(self, read, worker_first: int | None, in_worker: bool) -> None:
        """``read`` is the next pass's: the beginning keeps the loaded state's seed and
        exclusions (a run resumed reads as the one that saved it), from the start."""
        state = read.state
        self.beginning = dataclasses.replace(
            self.beginning, seed=state.seed, excluded=state.excluded
        )
        self.loaded = Loaded(read, worker_first, os.getpid(), in_worker)
        if not in_worker:  # a new state of the training process: no pass took it yet
            self.taken.value = self.latest.value = _NONE

    def start(self, info) -> Loaded | None:
        """A pass starts here (``info``: the DataLoader worker's, or None): the loaded
        state it takes, or None where it reads from the beginning."""
        self.count += 1
        loaded, self.loaded = self.loaded, None
        if info is None:
            number = _NONE - 1 - secrets.randbits(40)  # this process's own pass
        else:
            number = ((info.seed - info.id) * 1_000_003 + self.count) % 2**62 + 1
        if loaded is not None and not loaded.in_worker and loaded.pid != os.getpid():
            # inherited from the training process: the first DataLoader pass takes it
            if self.taken.value not in (_NONE, number):
                loaded = None
        if loaded is not None and not loaded.in_worker:
            self.taken.value = number
        if info is not None:
            self.latest.value = number
        return loaded

    def workers_took_loaded(self) -> bool:
        """In the training process: whether the pass DataLoader workers started last
        took the state loaded here (else it read from the beginning)."""
        return self.loaded is not None and self.taken.value == self.latest.value != _NONE

    def __getstate__(self) -> dict:
        # shared with the processes a DataLoader starts ("spawn"); other pickles get
        # their own copy of the values
        if multiprocessing.context.get_spawning_popen() is not None:
            return dict(self.__dict__)
        return {
            **self.__dict__,
            "taken": multiprocessing.RawValue("q", self.taken.value),
            "latest": multiprocessing.RawValue("q", self.latest.value),
        }
