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

import weakref
from multiprocessing.reduction import ForkingPickler

from reader.compat import torch as compat_torch
from schemas.errors import OperationError

_WORKER_FIRST = "worker_first"  # a DataLoader worker's state: its next batch
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


def worker_state(read_state: str, first: int) -> dict:
    """A DataLoader worker's state, as torchdata's ``StatefulDataLoader`` keeps it for each
    worker with the batches it yielded: where the worker's read stands (``read_state``,
    ReadState JSON), and its next batch counted from there (``first``, modulo the
    worker count)."""
    return {"read_state": read_state, _WORKER_FIRST: first}


def worker_first(state: dict) -> int | None:
    """The next batch of a worker's state from ``worker_state``; None for a reader's."""
    return state.get(_WORKER_FIRST)


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
