"""Shared memory blocks of the Python route's reads (``reader.routes.preprocess``): a batch's
arrays come from a worker process in one block, which the reader lends to the caller as
the arrays themselves (views of the block, no copy) and takes back for a later batch
once every array of that batch, and every view or tensor made from one, is gone.

A block can be page-locked for a GPU's copies while it is mapped here (``pinned``:
``TorchReader(device="cuda")``'s pass registers each block once with CUDA,
``reader.routes.torch_device.CudaPinning``, not a pin a batch; unregistered before it
is unmapped).

The blocks are named after the reader's process (``reader.cache.folder.this_owner``) and the
read, so the reader unlinks every block of a read when it ends, and a reader starting
removes those of readers that died all at once (``sweep``). A block still lent when the
read ends is unlinked by name and stays mapped until its arrays are gone.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import re
import threading
import weakref
from multiprocessing import shared_memory
from typing import Protocol

import numpy as np

from reader.cache.folder import dead, this_owner


class Blocks:
    """The shared memory blocks of a read, reused: a batch's arrays come in one block
    (``arrays``), which goes back to the free blocks once the caller drops them, and
    from there, with a later task, to whichever process takes it (``spare``; a new
    block costs its pages' first touch: 17 times a copy into a used one). The reader
    unlinks them all when the read ends (``prefix``: the start of their names, None
    where shared memory is not a folder; ``unlink``, ``sweep``).

    Args:
        lend_most: blocks lent at once; a batch beyond them is copied out, its block
            back at once (a caller keeping every batch holds heap, not shared memory).
    """

    def __init__(self, lend_most: int):
        self.prefix = f"evenshard-{this_owner()}-{next(_READS)}-" if _NAMED else None
        self.lend_most = lend_most
        self.free: list[str] = []  # back from the caller, ready for another batch
        self.lent: set[str] = set()  # a batch's arrays still live: neither reused nor closed
        self.known: set[str] = set()  # every block this read has seen: unlinked at its end
        self.mapped: dict[str, _Block | shared_memory.SharedMemory] = {}
        self.address: dict[str, int] = {}  # where each block is mapped here
        self.pinned: dict[str, Pinning] = {}  # blocks page-locked here, and by what
        self.ended = False
        # a block comes back when its last array goes, in whichever thread drops it
        # (TensorFlow's, a garbage collection inside this module's own calls): reentrant
        self.lock = threading.RLock()

    def spare(self) -> str | None:
        """A free block for the next batch's process (None: it makes one)."""
        with self.lock:
            return self.free.pop() if self.free else None

    def arrays(self, name: str, dropped: str | None, fields: dict) -> dict:
        """The arrays of a batch in block ``name`` (``fields``: name -> (offset, shape,
        dtype)), as views of the block whose ``base`` is one ``_Lent`` (the block back
        when it is gone); fields under ``SMALL`` bytes are copies (labels a caller keeps
        do not hold a block), and so is every field while ``lend_most`` blocks are out."""
        memory = self._attach(name, dropped)
        with self.lock:
            lend = len(self.lent) < self.lend_most
            if lend:
                self.lent.add(name)
        lent = _Lent()
        out = {}
        for field, (offset, shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            if not lend or math.prod(shape) * dtype.itemsize < SMALL:
                out[field] = np.ndarray(shape, dtype, memory.buf, offset).copy()
                continue
            lent.__array_interface__ = {
                "shape": tuple(shape),
                "typestr": dtype.str,
                "data": (self.address[name] + offset, False),  # writable: the caller's
                "version": 3,
            }
            out[field] = np.asarray(lent)  # its base: ``lent`` (a view's: a chain to it)
        if not lend:
            self._back(name, memory)
        else:
            back = weakref.finalize(lent, self._back, name, memory)
            back.atexit = False  # at exit the mapping goes with the process, arrays or not
        return out

    def _attach(self, name: str, dropped: str | None) -> _Block | shared_memory.SharedMemory:
        with self.lock:
            if dropped is not None:  # free, but too small: unlinked by the process
                self.known.discard(dropped)
                old = self._unmapped(dropped)
                if old is not None:
                    old.close()
            self.known.add(name)
            if name not in self.mapped:
                memory = attach(name)
                probe = np.frombuffer(memory.buf, np.uint8).__array_interface__
                self.address[name] = address = probe["data"][0]
                self.mapped[name] = memory  # the probe array is gone: the block closable
                pinning = _PINNING[-1] if _PINNING else None
                if pinning is not None and pinning.register(address, memory.size):
                    self.pinned[name] = pinning
            return self.mapped[name]

    def _unmapped(self, name: str):
        """Block ``name``'s map, no longer this read's (its page lock undone first), for
        the caller to close; None if it was not mapped."""
        address = self.address.pop(name, None)
        pinning = self.pinned.pop(name, None)
        if pinning is not None:
            pinning.unregister(address)
        return self.mapped.pop(name, None)

    def _back(self, name: str, memory: _Block | shared_memory.SharedMemory) -> None:
        """Block ``name``'s arrays are gone: free again, or unmapped once the read ended."""
        with self.lock:
            self.lent.discard(name)
            if not self.ended:
                self.free.append(name)
                return
            self._unmapped(name)
        memory.close()

    def unlink(self) -> None:
        """Every block of the read: those it knows, and those a process made and never
        handed over (ended meanwhile). One lent to live arrays is unlinked by name and
        stays mapped (unmapped under them, they would read freed memory): it is closed
        when they are gone (``_back``)."""
        made = _listed(self.prefix) if self.prefix else []
        with self.lock:
            self.ended = True
            # ``.get``, ``.pop(name, None)``: a collection here may run a ``_back``
            for name in self.known.union(made):
                memory = self.mapped.get(name)
                if name in self.lent and memory is not None:
                    _unlink_name(memory)
                else:
                    unlink_block(name, self._unmapped(name))
            for name in [n for n in self.mapped if n not in self.lent]:
                memory = self._unmapped(name)
                if memory is not None:
                    memory.close()
            self.known.clear()
            self.free.clear()


class Pinning(Protocol):
    """What page-locks blocks for a device's copies (``reader.routes.torch_device``)."""

    def register(self, address: int, size: int) -> bool:
        """Page-locks ``size`` bytes at ``address``; False where it could not."""
        ...

    def unregister(self, address: int) -> None:
        """Undoes ``register`` (before the memory is unmapped)."""
        ...


_PINNING: list[Pinning] = []  # the pinnings in force in this process, the last used


@contextlib.contextmanager
def pinned(pinning: Pinning):
    """Blocks mapped here while in force are page-locked by ``pinning`` (each once, while
    mapped): a read's batches then reach a GPU by DMA, with no pin a batch."""
    _PINNING.append(pinning)
    try:
        yield
    finally:
        _PINNING.remove(pinning)


class _Lent:
    """The ``base`` of a lent batch's arrays, numpy's owner of their memory (its
    ``__array_interface__``: the address of the field being made); the block goes back
    when it is gone, so no array, view or tensor outlives the block it reads."""

    __slots__ = ("__array_interface__", "__weakref__")


SMALL = 16 << 10  # bytes under which a field is copied out (a batch of 2,048 int64 labels)
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


class _Block:
    """A block in ``/dev/shm`` made or mapped by name with no claim of Python's resource
    tracker: before Python 3.13 every process that maps a block registers it, and the
    messages of a worker making one and of the reader unlinking it at its end can reach
    the tracker in either order (a leak warned of at exit, a ``KeyError`` printed). The
    reader unlinks its blocks when the read ends, and a reader starting removes those
    of readers that died (``sweep``).

    Args:
        size: the size of a new block (None: map the block that is there).
    """

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        flags = os.O_RDWR if size is None else os.O_RDWR | os.O_CREAT | os.O_EXCL
        fd = os.open(os.path.join(_SHM, name), flags, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self.size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, self.size)  # ValueError: made, not yet sized
        finally:
            os.close(fd)
        self.buf = memoryview(self._map)

    def close(self) -> None:
        self.buf.release()
        self._map.close()

    def unlink(self) -> None:
        """FileNotFoundError: another process unlinked it first."""
        os.unlink(os.path.join(_SHM, self.name))


def attach(name: str):
    """Block ``name`` mapped here (a ``_Block`` where blocks are files in ``/dev/shm``)."""
    return _Block(name) if _NAMED else shared_memory.SharedMemory(name)


def unlink_block(name: str, memory=None) -> None:
    """Unlinks block ``name`` of this read (``memory``: this process's map of it, closed)
    when still there; one this process made as a ``SharedMemory`` is unregistered too."""
    if memory is not None:
        memory.close()
    if _NAMED and not isinstance(memory, shared_memory.SharedMemory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_SHM, name))
        return
    if memory is None:  # no /dev/shm to unlink by name: map it to unlink it
        try:
            memory = shared_memory.SharedMemory(name)
        except (FileNotFoundError, ValueError):
            return
        memory.close()
    _unlink_name(memory)


def _unlink_name(memory) -> None:
    """Unlinks a mapped block's name, unless another process did first."""
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()


def sweep() -> None:
    """Removes the blocks of readers whose processes died all at once (kill -9 of a
    process group, a container's end): none was left to unlink them; and the
    semaphores an earlier release's pools named alike (``sem.evenshard-...``), which
    their resource tracker, killed too, did not unlink. A name is removed only when
    its reader is provably dead (``reader.cache.folder.dead``)."""
    for name in _listed("evenshard-") + _listed("sem.evenshard-"):
        owner = _OWNER.match(name.removeprefix("sem."))
        if owner and dead(owner[1]):
            unlink_block(name)  # (on Linux a semaphore is a file there, unlinked alike)


def new_block(
    spare: str | None, size: int, worker: dict
) -> tuple[_Block | shared_memory.SharedMemory, str | None]:
    """(a block of at least ``size`` bytes, the name of ``spare`` when it was too small
    and is unlinked here). Blocks stay mapped (``worker["blocks"]``) for the next batch;
    a new one is named after the read (``worker["prefix"]``) and this process."""
    mapped, dropped = worker["blocks"], None
    if spare is not None:
        memory = mapped.get(spare) or attach(spare)
        if memory.size >= size:
            mapped[spare] = memory
            return memory, None
        mapped.pop(spare, None)
        unlink_block(spare, memory)
        dropped = spare
    prefix = worker["prefix"]
    if prefix is None or not worker.get("process"):
        # the reader's own process (num_processes=0): the resource tracker, which no
        # other process tells of this block, unlinks it if the reader is killed
        name = None if prefix is None else f"{prefix}{os.getpid()}-{next(_BLOCKS)}"
        memory = shared_memory.SharedMemory(name, create=True, size=max(size, 1))
    else:
        worker["making"] = f"{prefix}{os.getpid()}-{next(_BLOCKS)}"  # ``unlink_all``'s too
        memory = _Block(worker["making"], max(size, 1))
    mapped[memory.name] = memory
    worker.pop("making", None)
    return memory, dropped


def unlink_all(worker: dict) -> None:
    """Unlinks every block a worker process made (``worker["blocks"]``), and the one it
    is making, if any: the process is ending."""
    making = worker.get("making")
    if making is not None and _NAMED:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(_SHM, making))
    for memory in list(worker["blocks"].values()):
        with contextlib.suppress(OSError):
            memory.unlink()


_BLOCKS = itertools.count()  # the blocks this process made (their names)
