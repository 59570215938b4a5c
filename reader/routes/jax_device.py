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


def check_rows(device, batch_size: int, options) -> None:
    """Refuses a read whose batches a ``Sharding`` cannot cut: ``jax.device_put`` needs
    each batch's rows to divide into the parts the sharding cuts them into, the final
    batch's too.

    Raises:
        InvalidValueError: ``batch_size`` does not divide, or a final partial batch may
            come (neither ``drop_remainder`` nor ``pad_final_batch``, and ``epochs``
            not None).
    """
    parts = row_parts(device)
    if parts == 1:
        return
    if batch_size % parts:
        raise InvalidValueError(
            f"batch_size={batch_size}: the sharding cuts each batch's rows into {parts} "
            f"parts; give a batch_size that {parts} divides"
        )
    endless = options.epochs is None  # batches run across epochs: none is partial
    if not (options.drop_remainder or options.pad_final_batch or endless):
        raise InvalidValueError(
            f"device= is a sharding that cuts each batch's rows into {parts} parts, and the "
            "final batch may be partial: give drop_remainder=True (training) or "
            "pad_final_batch=True (evaluation: batch['mask'] marks the padding rows)"
        )


def row_parts(device) -> int:
    """How many parts ``device`` cuts a batch's rows (its first axis) into: 1 for a
    ``jax.Device`` or a sharding that replicates the rows."""
    import jax

    if not isinstance(device, jax.sharding.Sharding):
        return 1
    devices = len(device.device_set)
    for rank in range(1, 9):  # the fewest axes the sharding's spec names
        try:
            return devices // device.shard_shape((devices,) * rank)[0]
        except (IndexError, ValueError):
            continue
    return 1


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
