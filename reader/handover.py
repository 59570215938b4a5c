"""Batches DataLoader workers hand to the training process, counted where they arrive.

A reader iterated in ``DataLoader`` workers cannot count what the training loop took:
the workers read ahead. Each batch a worker sends carries its reader's token, its count
(its position in the read: the batches of the read up to it, this one included) and
the worker count W, and is recognised in the process that unpickles it
(``ForkingPickler``, through which the DataLoader's queue sends it).

With one worker the batches arrive in order, as the loop takes them: the last one's
count is the number received. With W workers, worker ``w`` sends batches ``w, w + W,
...``, and they arrive as the workers finish them; the DataLoader's iterator keeps those
that came early and hands all over in turn (``in_order=True``), so what the loop took
is what that iterator yielded: the process that unpickles a batch finds the iterator on
its stack and counts by it (its count of the batches it yielded, kept when it goes; a
new pass of a persistent DataLoader restarts it; the names read are torch's private
ones, in ``reader.compat.torch``). Unknown, and said so: batches the DataLoader's
pin-memory thread unpickled (it runs ahead of the loop) and batches of several workers
unpickled outside an iterator. No torch here: plain multiprocessing.

torchdata's ``StatefulDataLoader`` needs none of this: it asks each worker's reader for
its state with every batch and counts what it yielded itself (``worker_state``); the
batches then travel untagged and no stack is walked.
"""

from __future__ import annotations

import multiprocessing
import secrets
import weakref
from multiprocessing.reduction import ForkingPickler

from reader.compat import torch as compat_torch
from reader.routes.torch_passes import worker_first, worker_state  # noqa: F401 (named here too)
from schemas.errors import OperationError

PINNED = "pinned"  # received by the DataLoader's pin-memory thread, ahead of the loop
UNORDERED = "unordered"  # several workers' batches, unpickled outside a DataLoader iterator


class _Yielded:
    """The batches a DataLoader iterator yielded, read from it while it lives and kept
    when it goes (``for`` ... ``break`` drops it)."""

    def __init__(self, iterator):
        self.iterator = weakref.ref(iterator)
        self.final = 0
        # holds the iterator's attributes, not the iterator: read when it goes
        weakref.finalize(iterator, self._gone, vars(iterator))

    def _gone(self, attributes: dict) -> None:
        self.final = compat_torch.yielded_in(attributes)

    def count(self) -> int:
        iterator = self.iterator()
        return self.final if iterator is None else compat_torch.yielded(iterator)


# reader token -> batches of its current iteration received here: the count of the last
# one, the iterator that yielded them, or PINNED / UNORDERED
_RECEIVED: dict[str, int | str | _Yielded] = {}


class Sent(dict):
    """A dict batch on its way from a DataLoader worker: ``token``, ``count`` (its
    position in the read, from 1), ``workers``."""


class SentList(list):
    """An (image, label[, mask]) batch on its way (the DataLoader makes tuples lists)."""


def sent(batch, token: str, count: int, workers: int = 1):
    """The batch, tagged to be counted for reader ``token`` where it arrives."""
    out = Sent(batch) if isinstance(batch, dict) else SentList(batch)
    out.token, out.count, out.workers = token, count, workers
    return out


def seen(token: str) -> bool:
    """Whether batches of reader ``token`` arrived here since it last started."""
    return token in _RECEIVED


def received(token: str) -> int | str:
    """Batches of reader ``token``'s iteration received here; PINNED or UNORDERED when
    that is unknown."""
    got = _RECEIVED[token]
    return got.count() if isinstance(got, _Yielded) else got


def forget(token: str) -> None:
    """A new iteration of reader ``token`` (or one in this process) starts the count."""
    _RECEIVED.pop(token, None)


class Tally:
    """One reader's batches that DataLoader workers send: the token naming them (a new one
    for each state loaded: batches of an older state still on their way are not counted
    for this one), and two values shared with the workers: whether one iterated, and the
    ``load_state_dict()`` calls (a persistent worker that still holds an older state
    refuses to read it)."""

    def __init__(self):
        self.token = None
        self.in_worker = multiprocessing.RawValue("b", 0)
        self.loads, self.loaded = multiprocessing.RawValue("l", 0), 0

    def __getstate__(self) -> dict:
        # the shared values go to the processes a DataLoader spawns, not into other pickles
        spawning = multiprocessing.context.get_spawning_popen() is not None
        flag = self.in_worker if spawning else multiprocessing.RawValue("b", 0)
        loads = self.loads if spawning else multiprocessing.RawValue("l", self.loaded)
        return {**self.__dict__, "in_worker": flag, "loads": loads}

    def load(self, in_worker: bool) -> None:
        """A state was loaded: its batches get a new token (in a StatefulDataLoader's
        worker, ``in_worker``, the values shared stay)."""
        if in_worker:
            return
        if self.token is not None:
            forget(self.token)
        self.token = secrets.token_hex(8)
        self.in_worker.value = 0
        self.loads.value += 1
        self.loaded = self.loads.value

    def start(self, in_worker: bool) -> None:
        """A pass starts, in a DataLoader worker or in the process that counts it."""
        if not in_worker:
            forget(self.token)  # counted here, not by a DataLoader's worker
            return
        if self.loads.value != self.loaded:
            raise OperationError(
                "TorchReader.load_state_dict() after a DataLoader(persistent_workers="
                "True) started its workers, which still hold the state they started "
                "with: make the DataLoader after load_state_dict(), or use "
                "persistent_workers=False"
            )
        self.in_worker.value = 1

    def sent(self, batch, count: int, workers: int):
        """``batch`` tagged to be counted for this reader where it arrives (``sent``)."""
        return sent(batch, self.token, count, workers)

    def received(self) -> int | None:
        """The batches of this iteration that DataLoader workers sent and reached this
        process; None where none did and no worker iterated (the reader counts its own).

        Raises:
            RuntimeError: where that is unknown (``TorchReader.state_dict``'s cases).
        """
        if seen(self.token):
            consumed = received(self.token)
            if consumed == PINNED:
                raise OperationError(
                    "TorchReader.state_dict() under DataLoader(pin_memory=True): the pin "
                    "thread takes batches ahead of the training loop, so which were trained "
                    "on is unknown; use pin_memory=False and move batches with "
                    ".to(device, non_blocking=True) in the loop"
                )
            if consumed == UNORDERED:
                raise OperationError(
                    "TorchReader.state_dict(): batches of several DataLoader workers "
                    "reached this process outside a DataLoader iterator, so which were "
                    "trained on is unknown; iterate the DataLoader itself"
                )
            return consumed
        if self.in_worker.value:
            raise OperationError(
                "TorchReader.state_dict(): a DataLoader worker reads this reader but none of "
                "its batches reached this process counted (a collate_fn that rebuilds them?); "
                "use DataLoader(reader, batch_size=None) without a collate_fn, or num_workers=0"
                " (a StatefulDataLoader's state is its own state_dict())"
            )
        return None


def _send(batch):
    return _arrive, (batch.token, batch.count, batch.workers, type(batch).__mro__[1](batch))


def _arrive(token: str, count: int, workers: int, batch):
    """Unpickled in the receiving process: counted by the DataLoader iterator on the
    stack, or by the batch's count (one worker), unless by the pin-memory thread."""
    for frame in compat_torch.caller_frames():
        code = frame.f_code
        if code.co_name == compat_torch.PIN_MEMORY_LOOP:
            _RECEIVED[token] = PINNED
            return batch
        if code.co_varnames[:1] == ("self",):
            iterator = frame.f_locals.get("self")
            if compat_torch.is_loader_iterator(iterator):
                _count_by(token, iterator, workers)
                return batch
    _RECEIVED[token] = count if workers == 1 else UNORDERED
    return batch


def _count_by(token: str, iterator, workers: int) -> None:
    if workers > 1 and not compat_torch.in_order(iterator):
        raise OperationError(
            f"TorchReader in a DataLoader(in_order=False) with num_workers={workers}: it "
            "would hand the batches over as the workers finish them, out of the read's "
            "order; leave in_order=True (the default)"
        )
    got = _RECEIVED.get(token)
    if not isinstance(got, _Yielded) or got.iterator() is not iterator:
        _RECEIVED[token] = _Yielded(iterator)


ForkingPickler.register(Sent, _send)
ForkingPickler.register(SentList, _send)
