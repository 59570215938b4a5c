"""Shared memory blocks of the Python route's reads (``reader.preprocess``): a batch's
arrays come from a worker process in one block, which the reader copies out and lends
back for a later batch.

The blocks are named after the reader's process (``cache_folder.this_owner``) and the
read, so the reader unlinks every block of a read when it ends, and a reader starting
removes those of readers that died all at once (``sweep``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from multiprocessing import shared_memory

from reader.cache_folder import dead, this_owner


class Blocks:
    """The shared memory blocks of a read, reused: a batch's arrays come in one block,
    which the reader copies out and lends, with a later task, to whichever process takes
    it (a new block costs its pages' first touch: 17 times the copy into a used one).
    The reader unlinks them all when the read ends (``prefix``: the start of their
    names, None where shared memory is not a folder; ``sweep``)."""

    def __init__(self):
        self.prefix = f"evenshard-{this_owner()}-{next(_READS)}-" if _NAMED else None
        self.free: list[str] = []  # copied out, ready for another batch
        self.known: set[str] = set()  # every block this read has seen: unlinked at its end
        self.mapped: dict[str, shared_memory.SharedMemory] = {}

    def lend(self) -> str | None:
        return self.free.pop() if self.free else None

    def attach(self, name: str, dropped: str | None) -> shared_memory.SharedMemory:
        if dropped is not None:  # lent, but too small: unlinked by the process
            self.known.discard(dropped)
            old = self.mapped.pop(dropped, None)
            if old is not None:
                old.close()
        self.known.add(name)
        if name not in self.mapped:
            self.mapped[name] = shared_memory.SharedMemory(name)
        return self.mapped[name]

    def unlink(self) -> None:
        """Every block of the read: those it knows, and those a process made and never
        handed over (ended meanwhile)."""
        made = _listed(self.prefix) if self.prefix else []
        for name in self.known.union(made):
            _unlink(name, self.mapped.pop(name, None))
        for memory in self.mapped.values():
            memory.close()
        self.known.clear()
        self.free.clear()


_SHM = "/dev/shm"  # where Linux keeps the blocks, by name
_NAMED = os.path.isdir(_SHM)
_READS = itertools.count()  # the reads of this process (their blocks' names)
_OWNER = re.compile(r"evenshard-([0-9a-f]{12}-[0-9]+-[0-9]+)-")  # ``this_owner`` of a name


def _listed(start: str) -> list[str]:
    """The blocks whose names begin with ``start``."""
    try:
        return [name for name in os.listdir(_SHM) if name.startswith(start)]
    except OSError:
        return []


def _unlink(name: str, memory: shared_memory.SharedMemory | None = None) -> None:
    """Unlinks block ``name`` (``memory``: this process's map of it) when still there."""
    try:
        memory = memory or shared_memory.SharedMemory(name)
    except FileNotFoundError:
        return
    except ValueError:  # made but not yet sized by a process that ended: it cannot be mapped
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_SHM, name))
        return
    memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()


def sweep() -> None:
    """Removes the blocks of readers whose processes died all at once (kill -9 of a
    process group, a container's end): none was left to unlink them. A block is
    removed only when its reader is provably dead (``cache_folder.dead``)."""
    for name in _listed("evenshard-"):
        owner = _OWNER.match(name)
        if owner and dead(owner[1]):
            _unlink(name)


def new_block(
    spare: str | None, size: int, worker: dict
) -> tuple[shared_memory.SharedMemory, str | None]:
    """(a block of at least ``size`` bytes, the name of ``spare`` when it was too small
    and is unlinked here). Blocks stay mapped (``worker["blocks"]``) for the next batch;
    a new one is named after the read (``worker["prefix"]``) and this process."""
    mapped, dropped = worker["blocks"], None
    if spare is not None:
        memory = mapped.get(spare) or shared_memory.SharedMemory(spare)
        if memory.size >= size:
            mapped[spare] = memory
            return memory, None
        mapped.pop(spare, None)
        memory.close()
        memory.unlink()
        dropped = spare
    prefix = worker["prefix"]
    name = None if prefix is None else f"{prefix}{os.getpid()}-{next(_BLOCKS)}"
    memory = shared_memory.SharedMemory(name, create=True, size=max(size, 1))
    mapped[memory.name] = memory
    return memory, dropped


_BLOCKS = itertools.count()  # the blocks this process made (their names)
