"""The read options in the groups a reader has, each a frozen dataclass that checks
itself; a face states the groups it takes (``refuse_untaken``).

The groups follow what the faces honour (docs/design.md, "Options in groups"):
every face takes the order, the sharding, the images, the batches, the bucket cache
and the errors (tf.data's ``on_error="skip"`` reads the Python route);
``as_supervised`` (form), tf.data's tuning and ``prefetch_to_device`` (device) are
taken only where they mean something.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from reader.order.augment import Augment
from schemas.errors import InvalidTypeError, InvalidValueError

AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow here


def whole(value) -> bool:
    """An int (numpy's too); 2.0 and True are mistakes."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_whole(group, *names: str) -> None:
    """Options that count are ints (2.0 or True is a mistake, said at once, not deep in
    tf.data); None passes."""
    for name in names:
        value = getattr(group, name)
        if value is not None and not whole(value):
            raise InvalidTypeError(f"{name} must be a whole number (int), got {value!r}")


@dataclasses.dataclass(frozen=True)
class OrderOptions:
    """The read order: shuffling, its seed, epochs and the interleave."""

    shuffle: bool | None = None
    seed: int | None = None
    epochs: int | None = 1
    shuffle_buffer: int = 1000
    cycle_length: int | None = None
    block_length: int = 1
    deterministic: bool | None = None
    random_access: bool | None = None

    def __post_init__(self) -> None:
        check_whole(self, "seed", "epochs", "shuffle_buffer", "cycle_length", "block_length")
        if self.random_access not in (None, True, False):
            raise InvalidTypeError(
                f"random_access must be True, False or None, got {self.random_access!r}"
            )
        if self.epochs is not None and self.epochs < 1:
            raise InvalidValueError(f"epochs must be >= 1 or None, got {self.epochs}")
        if self.shuffle_buffer < 0:
            raise InvalidValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if self.cycle_length is not None and self.cycle_length < 1:
            raise InvalidValueError(f"cycle_length must be >= 1 or None, got {self.cycle_length}")
        if self.block_length < 1:
            raise InvalidValueError(f"block_length must be >= 1, got {self.block_length}")


@dataclasses.dataclass(frozen=True)
class ShardingOptions:
    """This reader's share of the files: an ``input_context``, or ``num_workers`` and
    ``worker_index``."""

    input_context: object = None
    num_workers: int | None = None
    worker_index: int | None = None

    def __post_init__(self) -> None:
        check_whole(self, "num_workers", "worker_index")
        if self.input_context is not None:
            if self.num_workers is not None or self.worker_index is not None:
                raise InvalidValueError("give input_context or num_workers/worker_index, not both")
        elif (self.num_workers is None) != (self.worker_index is None):
            raise InvalidValueError("num_workers and worker_index go together")
        elif self.num_workers is not None:
            if self.num_workers < 1:
                raise InvalidValueError(f"num_workers must be >= 1, got {self.num_workers}")
            if not 0 <= self.worker_index < self.num_workers:
                raise InvalidValueError(
                    f"worker_index must be in [0, {self.num_workers}), got {self.worker_index}"
                )

    def workers(self) -> tuple[int, int]:
        """(number of workers, this worker's index)."""
        if self.input_context is not None:
            ctx = self.input_context
            return ctx.num_input_pipelines, ctx.input_pipeline_id
        if self.num_workers is None:
            return 1, 0
        return self.num_workers, self.worker_index


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """Decoding and the built-in augmentations (and where path records' files are)."""

    decode: bool = True
    image_size: tuple[int, int] | None = None
    channels: int = 3
    random_crop: bool = False
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    random_flip: bool = False
    path_root: str | None = None

    def __post_init__(self) -> None:
        check_whole(self, "channels")
        if self.channels not in (1, 3, 4):
            raise InvalidValueError(f"channels must be 1, 3 or 4, got {self.channels}")
        if self.image_size is not None:
            # an int is a square, as torchvision's Resize(32) and RandomResizedCrop(32)
            square = isinstance(self.image_size, numbers.Integral)
            iterable = square or hasattr(self.image_size, "__iter__")
            size = (self.image_size,) * 2 if square else tuple(self.image_size) if iterable else ()
            if len(size) != 2 or not all(whole(v) and v >= 1 for v in size):
                raise InvalidValueError(
                    f"image_size must be (height, width), whole numbers >= 1, got {self.image_size}"
                )
            object.__setattr__(self, "image_size", tuple(int(v) for v in size))
        for name, top in (("crop_scale", 1.0), ("crop_ratio", math.inf)):
            pair = getattr(self, name)
            try:
                low, high = (float(v) for v in pair)
            except (TypeError, ValueError):
                low = high = math.nan
            if not 0 < low <= high <= top:
                raise InvalidValueError(
                    f"{name} must be (min, max) with 0 < min <= max"
                    f"{' <= 1' if top == 1.0 else ''}, got {pair!r}"
                )
            object.__setattr__(self, name, (low, high))

    @property
    def augmenting(self) -> bool:
        """Whether built-in augmentations run (their draws need the seed and epoch)."""
        return self.random_crop or self.random_flip

    def augment(self, mirror: bool = False) -> Augment | None:
        """The built-in augmentations asked for (``mirror``: views in mirrored pairs), or
        None."""
        if not (self.augmenting or mirror):
            return None
        return Augment(self.random_crop, self.crop_scale, self.crop_ratio, self.random_flip, mirror)


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """The final batch: dropped, or padded with masked rows."""

    drop_remainder: bool = False
    pad_final_batch: bool = False


@dataclasses.dataclass(frozen=True)
class FormOptions:
    """The form of an element: a dict, or (image, label[, weight]) tuples."""

    as_supervised: bool = False


@dataclasses.dataclass(frozen=True)
class BucketOptions:
    """Local copies of a bucket's shards, fetched ahead (``reader/cache/shard_cache.py``)."""

    cache_dir: str | None = None
    cache_limit: int = 10 * 2**30

    def __post_init__(self) -> None:
        check_whole(self, "cache_limit")
        if self.cache_limit < 1:
            raise InvalidValueError(f"cache_limit must be >= 1 (bytes), got {self.cache_limit}")


@dataclasses.dataclass(frozen=True)
class TuningOptions:
    """tf.data's own input/output: records cached in memory, prefetch, parallel calls."""

    cache: bool = False
    prefetch: int | None = AUTOTUNE
    num_parallel_calls: int = AUTOTUNE

    def __post_init__(self) -> None:
        check_whole(self, "prefetch", "num_parallel_calls")


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """Batches prefetched onto an accelerator by tf.data."""

    prefetch_to_device: str | bool | None = None


@dataclasses.dataclass(frozen=True)
class ErrorOptions:
    """What a record that cannot be read does: stop the read, or become padding."""

    on_error: str = "raise"
    max_errors: int = 100
    error_ledger: str | None = None

    def __post_init__(self) -> None:
        check_whole(self, "max_errors")
        if self.on_error not in ("raise", "skip"):
            raise InvalidValueError(f'on_error must be "raise" or "skip", got {self.on_error!r}')
        if self.on_error == "skip" and not isinstance(self.error_ledger, str):
            raise InvalidValueError(
                'on_error="skip" writes each record skipped: give error_ledger=PATH'
            )
        if self.max_errors < 0:
            raise InvalidValueError(f"max_errors must be >= 0, got {self.max_errors}")


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """Records that are not images (record_kind example): the features to parse, a dict
    of ``tf.io`` specs or ``reader.examples.Feature`` (None: ``schema.pbtxt``'s)."""

    features: dict | None = None

    def __post_init__(self) -> None:  # each spec is checked where it is parsed (as_spec)
        if self.features is not None and (not isinstance(self.features, dict) or not self.features):
            raise InvalidTypeError(
                f"features must be a dict of feature specs, got {self.features!r}"
            )


@dataclasses.dataclass(frozen=True)
class PythonStage:
    """The Python route's stage, a face's keywords beside its options: a user's
    ``transform(example, rng)`` on each image decoded once, ``views`` of each (together
    in a batch, or ``view_spread`` batches apart; ``mirror_views``: in mirrored pairs),
    and the ``num_processes`` worker processes that run it (None: the cores). The one
    place these are checked and the one rule for when a read takes the Python route
    (``needed``): ``NumpyReader``, ``TorchReader`` and ``make_dataset`` take them."""

    transform: object = None
    views: int = 1
    view_spread: int | str = "together"
    mirror_views: bool = False
    num_processes: int | None = None

    def __post_init__(self) -> None:
        if self.transform is not None and not callable(self.transform):
            raise InvalidTypeError(
                f"transform must be a function fn(example, rng) -> dict, got {self.transform!r}"
            )
        n = self.num_processes
        if n is not None and not whole(n):
            raise InvalidTypeError(f"num_processes must be a whole number (int), got {n!r}")
        if n is not None and n < 0:
            raise InvalidValueError(f"num_processes must be a whole number >= 0, got {n!r}")

    def needed(self, on_error: str = "raise") -> bool:
        """Whether a read takes the Python route: a transform, views, mirrored views,
        worker processes asked for (``num_processes``), or records skipped one by one
        (``on_error="skip"``: inside TensorFlow a record that fails fails its whole
        batch)."""
        return (
            self.transform is not None
            or self.views != 1
            or bool(self.mirror_views)
            or self.num_processes is not None
            or on_error == "skip"
        )

    def route(self, on_error: str = "raise", backend: str | None = None) -> str | None:
        """The route a read takes, chosen here for every face: "python" where it is
        ``needed`` (``on_error="skip"`` takes it only where no backend is asked), else
        the ``backend`` asked (TorchReader's "tf", "dali" or "python"; None: the face's
        default: the graph, or TorchReader's for the machine). One line where the
        keywords and the backend do not fit."""
        python = self.needed(on_error if backend is None else "raise")
        if python and backend not in ("python", None):
            raise InvalidValueError(
                "transform=, views= and num_processes= run on the Python route: "
                f'backend="python" (or None), not {backend!r}'
            )
        if backend == "tf" and on_error != "raise":
            raise InvalidValueError(
                'on_error="skip" is the Python faces\': TorchReader(backend="python" or '
                '"dali"); with tf.data a record fails inside TensorFlow'
            )
        return "python" if python else backend


# group name -> its class, in the order the flat keywords are checked
GROUPS = {
    "ordering": OrderOptions,
    "sharding": ShardingOptions,
    "images": ImageOptions,
    "batches": BatchOptions,
    "form": FormOptions,
    "bucket": BucketOptions,
    "tuning": TuningOptions,
    "device": DeviceOptions,
    "errors": ErrorOptions,
    "records": RecordOptions,
}


def refuse_untaken(options, takes: frozenset, face: str, instead: dict[str, str]) -> None:
    """A one-line ``ValueError`` naming the options set away from their defaults in a
    group ``face`` does not take.

    Args:
        options: a ``ReadOptions`` (its groups are attributes named as in ``GROUPS``).
        takes: the names of the groups the face takes.
        face: the face, as the message names it.
        instead: for each group it does not take, what to do instead.
    """
    for name in GROUPS:
        if name in takes:
            continue
        group = getattr(options, name)
        default = type(group)()
        changed = [
            f.name
            for f in dataclasses.fields(group)
            if getattr(group, f.name) != getattr(default, f.name)
        ]
        if changed:
            raise InvalidValueError(f"{face} does not honour {', '.join(changed)}: {instead[name]}")
