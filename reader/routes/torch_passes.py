"""Which state each pass of a ``TorchReader`` reads from.

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

from reader.values.state import ReadState


@dataclasses.dataclass
class Loaded:
    """A loaded state not yet read: its read (``reader.front.read.resolve``'s), the first
    batch of a ``StatefulDataLoader`` worker's state, and the process that loaded it."""

    read: object
    worker_first: int | None
    pid: int


class Passes:
    """The beginning of a reader's read, and the state loaded for its next pass."""

    def __init__(self, beginning: ReadState):
        self.beginning = beginning
        self.loaded: Loaded | None = None

    def load(self, read, worker_first: int | None) -> None:
        """``read`` is the next pass's: the beginning keeps the loaded state's seed and
        exclusions (a run resumed reads as the one that saved it), from the start."""
        state = read.state
        self.beginning = dataclasses.replace(
            self.beginning, seed=state.seed, excluded=state.excluded
        )
        self.loaded = Loaded(read, worker_first, os.getpid())

    def start(self) -> Loaded | None:
        """A pass starts here: the loaded state it reads from, or None where it reads
        from the beginning."""
        loaded = self.loaded
        if loaded is not None and loaded.pid == os.getpid():
            self.loaded = None  # loaded here: this pass only
        return loaded

    def workers_read(self) -> ReadState | None:
        """In the training process: the state DataLoader workers copied, which their
        passes read from (None: the beginning)."""
        return None if self.loaded is None else self.loaded.read.state
