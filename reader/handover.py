"""Batches a DataLoader worker hands to the training process, counted where they arrive.

A reader iterated in a ``DataLoader`` worker cannot count what the training loop took:
the worker reads ahead. Each batch it sends carries its reader's token and count, and
is counted in the process that unpickles it (``ForkingPickler``, through which the
DataLoader's queue sends it), unless the DataLoader's pin-memory thread unpickled it,
which runs ahead of the loop. No torch here: plain multiprocessing.
"""

from __future__ import annotations

import sys
from multiprocessing.reduction import ForkingPickler

# reader token -> batches of its current iteration received here (None: by the
# DataLoader's pin-memory thread, ahead of the training loop)
_RECEIVED: dict[str, int | None] = {}


class Sent(dict):
    """A dict batch on its way from a DataLoader worker: ``token``, ``count``."""


class SentList(list):
    """An (image, label[, mask]) batch on its way (the DataLoader makes tuples lists)."""


def sent(batch, token: str, count: int):
    """The batch, tagged to be counted for reader ``token`` where it arrives."""
    out = Sent(batch) if isinstance(batch, dict) else SentList(batch)
    out.token, out.count = token, count
    return out


def seen(token: str) -> bool:
    """Whether batches of reader ``token`` arrived here since it last started."""
    return token in _RECEIVED


def received(token: str) -> int | None:
    """Batches of reader ``token``'s iteration received here; None: unknown (pinned)."""
    return _RECEIVED[token]


def forget(token: str) -> None:
    """A new iteration of reader ``token`` (or one in this process) starts the count."""
    _RECEIVED.pop(token, None)


def _send(batch):
    return _arrive, (batch.token, batch.count, type(batch).__mro__[1](batch))


def _arrive(token: str, count: int, batch):
    """Unpickled in the receiving process: counted, unless by the pin-memory thread."""
    frame, pinned = sys._getframe(1), False
    while frame is not None and not pinned:
        pinned, frame = frame.f_code.co_name == "_pin_memory_loop", frame.f_back
    _RECEIVED[token] = None if pinned else count
    return batch


ForkingPickler.register(Sent, _send)
ForkingPickler.register(SentList, _send)
