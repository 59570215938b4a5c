"""PyTorch's private names that evenshard relies on, and nowhere else.

The plain ``torch.utils.data.DataLoader`` has no protocol telling a dataset which of its
batches the training loop took; ``reader.handover`` learns it from the DataLoader's
iterator found on the stack of the process that unpickles a batch. These are the names
it reads. torchdata's ``StatefulDataLoader`` needs none of them: it asks each worker's
reader for its ``state_dict()`` (``TorchReader``) and counts what it yielded itself.

``check()`` says, naming the installed version, when a release changes one of them
(tests/test_compat.py runs it). Checked with torch 2.13.0. No torch import here but in
``check()``: ``reader.handover`` stays plain multiprocessing.
"""

from __future__ import annotations

import sys

from schemas.errors import OperationError

# the function of the DataLoader's pin-memory thread (torch.utils.data._utils.pin_memory)
PIN_MEMORY_LOOP = "_pin_memory_loop"
# a DataLoader iterator's count of the batches it yielded (_BaseDataLoaderIter)
_YIELDED = "_num_yielded"
# a multi-worker DataLoader iterator's in_order flag (_MultiProcessingDataLoaderIter)
_IN_ORDER = "_in_order"


def caller_frames(depth: int = 1):
    """The frames of the calling stack, innermost first, from ``depth`` frames above the
    caller of this function."""
    frame = sys._getframe(depth + 1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def is_loader_iterator(value) -> bool:
    """Whether ``value`` is a DataLoader iterator (it counts what it yielded)."""
    return hasattr(value, _YIELDED)


def yielded(iterator) -> int:
    """The batches a DataLoader iterator yielded in its current pass."""
    return getattr(iterator, _YIELDED)


def yielded_in(attributes: dict) -> int:
    """The same, from the attributes (``vars()``) of an iterator that has gone."""
    return attributes.get(_YIELDED, 0)


def in_order(iterator) -> bool:
    """Whether a DataLoader iterator hands its workers' batches over in turn."""
    return getattr(iterator, _IN_ORDER, True) is not False


def check() -> None:
    """Raises RuntimeError, naming the name and the installed torch, unless every name
    above is where this module reads it."""
    import inspect

    import torch
    from torch.utils.data import dataloader

    where = f"torch {torch.__version__} (reader/compat/torch.py, checked with 2.13.0)"
    loader = torch.utils.data.DataLoader([1, 2, 3], batch_size=None)
    iterator = iter(loader)
    next(iterator)
    if not is_loader_iterator(iterator) or yielded(iterator) != 1:
        raise OperationError(f"{where}: a DataLoader iterator counts no {_YIELDED}")
    pin = sys.modules.get("torch.utils.data._utils.pin_memory")
    if pin is None or not inspect.isfunction(getattr(pin, PIN_MEMORY_LOOP, None)):
        raise OperationError(f"{where}: the pin-memory thread no longer runs {PIN_MEMORY_LOOP}")
    source = inspect.getsource(dataloader._MultiProcessingDataLoaderIter.__init__)
    if f"self.{_IN_ORDER} = " not in source:
        raise OperationError(f"{where}: a DataLoader iterator no longer keeps {_IN_ORDER}")
