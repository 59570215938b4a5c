"""``TorchReader(device=...)``: batches moved to a CUDA device (or the CPU) ahead of use
(``reader.routes.ahead``).

On a CUDA device each batch is copied on a side stream. While a pass runs, each of the
Python route's shared memory blocks is page-locked with CUDA once, as it is first
mapped here (``cudaHostRegister``: not a pin a batch), so a batch's copy is a DMA from
where the worker wrote it. A host batch is dropped after its copy's event, and the
copied tensors are marked used by the training loop's stream. Batches of other routes
(tf.data's, in pageable memory) are copied the same way, without the page lock.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from reader.examples import Padded
from reader.routes.shared_blocks import pinned
from schemas.errors import InvalidValueError, OperationError

log = logging.getLogger(__name__)


def checked_device(device) -> torch.device | None:
    """``device`` as a ``torch.device`` (None: batches stay CPU tensors).

    Raises:
        InvalidValueError: not a device torch names, a CUDA device torch cannot see, or
            a device type other than "cpu" and "cuda".
    """
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InvalidValueError(f"device={device!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        cuda = torch.version.cuda
        built = f"built for CUDA {cuda}" if cuda else "built without CUDA"
        raise InvalidValueError(
            f"device={str(device)!r}: torch sees no CUDA device (torch.cuda.is_available() "
            f"is False; torch {torch.__version__} is {built}); leave device=None for CPU "
            "tensors"
        )
    if device.type not in ("cpu", "cuda"):
        raise InvalidValueError(
            f"device={str(device)!r}: TorchReader moves batches to a CUDA device or the CPU; "
            "move them to another device in the loop (.to(device))"
        )
    return device


class TorchMove:
    """Puts batches of tensors on ``device`` (``reader.routes.ahead.Move``)."""

    def __init__(self, device: torch.device):
        self.device = device

    def check(self) -> None:
        if torch.utils.data.get_worker_info() is not None:
            raise OperationError(
                f"TorchReader(device={str(self.device)!r}) in a DataLoader worker: a "
                "worker cannot hand device tensors over; leave device=None and move each "
                "batch in the loop with .to(device, non_blocking=True), or iterate the "
                "reader itself"
            )

    @contextlib.contextmanager
    def session(self):
        if self.device.type != "cuda":
            yield lambda batch: (_mapped(lambda t: t.to(self.device), batch), _done)
            return
        stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)

        def put(batch):
            with torch.cuda.stream(stream):
                moved = _mapped(lambda t: t.to(self.device, non_blocking=True), batch)
                copied = torch.cuda.Event()
                copied.record(stream)

            def wait():
                copied.synchronize()
                _mapped(lambda t: t.record_stream(current), moved)  # used there from now

            return moved, wait

        with pinned(CudaPinning()):
            yield put


def _done() -> None:
    """A copy that finished as it was made (the CPU's)."""


class CudaPinning:
    """Page-locks shared memory blocks with ``cudaHostRegister`` (``shared_blocks.pinned``)."""

    def __init__(self):
        self.cudart = torch.cuda.cudart()
        self.refused = False  # said once: a limit on locked memory (ulimit -l)

    def register(self, address: int, size: int) -> bool:
        # as torch.cuda._pin_memory_utils registers shared memory: portable (1), every
        # CUDA context sees it page-locked; 0 is cudaSuccess
        error = int(self.cudart.cudaHostRegister(address, size, 1))
        if error == 0:
            return True
        if not self.refused:
            self.refused = True
            log.warning(
                "evenshard: CUDA did not page-lock a batch block (%s): batches are copied "
                "from pageable memory (slower); raise the locked-memory limit (ulimit -l)",
                error,
            )
        return False

    def unregister(self, address: int) -> None:
        self.cudart.cudaHostUnregister(address)


def _mapped(fn, value):
    """``fn`` of every tensor in a batch (a dict, tuple, list or ``Padded`` of them)."""
    if isinstance(value, torch.Tensor):
        out = fn(value)
        return value if out is None else out
    if isinstance(value, dict):
        return {k: _mapped(fn, v) for k, v in value.items()}
    if isinstance(value, Padded):
        return Padded(_mapped(fn, value.values), _mapped(fn, value.lengths))
    if isinstance(value, (tuple, list)):
        return type(value)(_mapped(fn, v) for v in value)
    return value
