"""``NumpyReader(device=...)``: batches put on a JAX device ahead of use
(``reader.routes.ahead``): ``jax.device_put`` of each array field (a copy, never an alias
of the shared block the batch came in), two batches before the loop takes it; the host
batch is dropped once its arrays are on the device."""

from __future__ import annotations

import contextlib

import numpy as np

from schemas.errors import InvalidValueError


def checked_device(device):
    """``device`` as ``jax.device_put`` takes it: a ``jax.Device`` or a ``Sharding`` (rows
    split across devices) as given, a platform name ("cpu", "gpu", "tpu") as its first
    device.

    Raises:
        InvalidValueError: JAX is not installed, or has no such device.
    """
    try:
        import jax
    except ImportError as e:
        raise InvalidValueError(
            f"device={device!r}: NumpyReader puts batches on a JAX device, and JAX is not "
            f"installed ({e}); pip install jax, or leave device=None for numpy arrays"
        ) from None
    if isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if not isinstance(device, str):
        raise InvalidValueError(
            f'device={device!r}: give a jax.Device, a Sharding or a platform name ("cpu", "gpu")'
        )
    try:
        return jax.devices(device)[0]
    except RuntimeError as e:
        raise InvalidValueError(f"device={device!r}: JAX has no such device ({e})") from None


class JaxMove:
    """Puts a batch's arrays on a JAX device (``reader.routes.ahead.Move``); other fields
    (lists of keys, strings) stay as they are."""

    def __init__(self, device):
        self.device = device

    def check(self) -> None:
        """Any process may put batches on a JAX device."""

    @contextlib.contextmanager
    def session(self):
        import jax

        def put(batch: dict):
            arrays = {k: v for k, v in batch.items() if _numeric(v)}
            moved = jax.device_put(arrays, self.device, may_alias=False)
            return {**batch, **moved}, lambda: jax.block_until_ready(moved)

        yield put


def _numeric(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biuf"
