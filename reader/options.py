"""``ReadOptions``: how ``make_dataset`` reads a split, as one frozen, self-checking object."""

from __future__ import annotations

import dataclasses
import math
import numbers

from reader.order.augment import Augment

AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow here
DEFAULT_CYCLE = 16  # runs read at once when cycle_length is None
MAX_POSITION = 2**62  # records and batches are counted in int64 (tf.data, numpy)


# Options that count: an int (2.0 or True is a mistake, said at once, not deep in tf.data).
_WHOLE = (
    "seed",
    "epochs",
    "shuffle_buffer",
    "cycle_length",
    "block_length",
    "channels",
    "num_workers",
    "worker_index",
    "start_epoch",
    "start_step",
    "prefetch",
    "num_parallel_calls",
    "cache_limit",
    "max_errors",
)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Options of :func:`reader.make_dataset` (like TFDS ``ReadConfig``, Grain ``ReadOptions``).

    Attributes:
        shuffle: shuffle files and examples; default (None) True for "train" only.
        seed: makes every shuffle reproducible; also turns ``deterministic`` on.
        epochs: passes over the split; None repeats forever.
        shuffle_buffer: examples shuffled together: each window of this many
            consecutive records is permuted, by a seeded permutation of
            (seed, epoch, window), which a resumed read can recompute (0:
            files and interleave only; the shards are already globally
            shuffled).
        cycle_length: runs of records read at once, round-robin (default 16;
            shuffled, each file is cut into runs at seeded points, new every
            epoch; unshuffled, a run is a file). See ``reader/order/plan.py``.
        block_length: consecutive records taken from a run in turn.
        deterministic: fixed output order. Default: True with a seed or without
            shuffling (evaluation reads in one fixed order, the short batch last);
            False only for unseeded shuffling, whose order is random anyway.
        decode: decode images (False: ``image`` holds the encoded bytes).
        image_size: (height, width) to resize to, or one int for a square; needed to batch decoded
            images, whose sizes differ.
        channels: channels of decoded images (1, 3 or 4).
        random_crop: crop a random box before resizing, torchvision's
            ``RandomResizedCrop``: an area fraction in ``crop_scale``, an aspect ratio
            in ``crop_ratio`` (JPEG decodes only the box). Every reader draws the same
            box for the same record, epoch and view (``reader/order/augment.py``).
        crop_scale, crop_ratio: the crop's (min, max) area fraction and aspect ratio.
        random_flip: flip each image left-right with probability 1/2, drawn like
            the crop.
        input_context: a ``tf.distribute.InputContext``; or give
            ``num_workers`` and ``worker_index``.
        num_workers, worker_index: this reader's share of the files.
        drop_remainder: drop a final partial batch.
        pad_final_batch: pad the final batch to ``batch_size`` and add a boolean
            ``mask`` feature (False on padding): static shapes for evaluation.
        as_supervised: yield (image, label) instead of a dict; with
            ``pad_final_batch``, (image, label, sample_weight), the weight 0.0
            on padding, so Keras ``weighted_metrics`` count real examples only.
        path_root: path kind: the folder the stored paths are relative to
            (default: the one recorded at conversion).
        cache: hold this worker's serialized records in memory, read once
            when the dataset is built (small datasets only).
        cache_dir, cache_limit: a dataset in a bucket (gs://, s3://) is read from local
            copies of its shards in ``cache_dir`` (default: ``evenshard-cache-<uid>`` in
            the system's temp folder, made 0700, shared by this user's ranks of the
            machine; a folder others can write is refused), fetched
            ahead in the order the read uses them, at most ``cache_limit`` bytes
            (default 10 GiB) at once; under a limit below 70 % of the worker's
            shards, each run of records is fetched as a byte range and dropped when
            read, so each byte is downloaded once an epoch (``reader/cache.py``).
        start_epoch, start_step: where to start: batch ``start_step`` (an
            example, with batch_size=None) counted from the start of epoch
            ``start_epoch``. With start_epoch 0 the dataset yields exactly
            what the uninterrupted read yields from that batch on, without
            reading or decoding the skipped records; ``epochs`` still counts
            from epoch 0. See :class:`reader.ReadState` and ``reader.resume``.
        prefetch: batches to prefetch (None: no prefetch).
        prefetch_to_device: a device name such as "/gpu:0", True for the first
            GPU, False for none; default: the first GPU when one is visible.
        num_parallel_calls: parallelism of interleave and decode.
        on_error: a record that cannot be read (damaged, or a path record's file
            gone): "raise" (default) stops the read; "skip" (the Python faces:
            ``NumpyReader``, ``TorchReader`` python or dali, ``make_dali_pipeline``)
            gives its row as a padding row (``mask`` False) and writes it once to
            ``error_ledger`` (a JSON line: key, shard, offset, reason, epoch, step).
        max_errors: with "skip", the read stops (one line naming the ledger) at the
            record after this many.
        error_ledger: the file the skipped records are appended to.
    """

    shuffle: bool | None = None
    seed: int | None = None
    epochs: int | None = 1
    shuffle_buffer: int = 1000
    cycle_length: int | None = None
    block_length: int = 1
    deterministic: bool | None = None
    decode: bool = True
    image_size: tuple[int, int] | None = None
    channels: int = 3
    random_crop: bool = False
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    random_flip: bool = False
    input_context: object = None
    num_workers: int | None = None
    worker_index: int | None = None
    drop_remainder: bool = False
    pad_final_batch: bool = False
    as_supervised: bool = False
    path_root: str | None = None
    cache: bool = False
    cache_dir: str | None = None
    cache_limit: int = 10 * 2**30
    start_epoch: int = 0
    start_step: int = 0
    prefetch: int | None = AUTOTUNE
    prefetch_to_device: str | bool | None = None
    num_parallel_calls: int = AUTOTUNE
    on_error: str = "raise"
    max_errors: int = 100
    error_ledger: str | None = None

    def __post_init__(self) -> None:
        for name in _WHOLE:
            value = getattr(self, name)
            if value is not None and not _whole(value):
                raise TypeError(f"{name} must be a whole number (int), got {value!r}")
        for name in ("start_epoch", "start_step"):
            if getattr(self, name) >= MAX_POSITION:
                raise ValueError(f"{name} must be below 2**62, got {getattr(self, name)}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {self.epochs}")
        if self.channels not in (1, 3, 4):
            raise ValueError(f"channels must be 1, 3 or 4, got {self.channels}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if self.start_step < 0 or self.start_epoch < 0:
            raise ValueError(
                f"start_epoch and start_step must be >= 0, got {self.start_epoch}, "
                f"{self.start_step}"
            )
        if self.cycle_length is not None and self.cycle_length < 1:
            raise ValueError(f"cycle_length must be >= 1 or None, got {self.cycle_length}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f'on_error must be "raise" or "skip", got {self.on_error!r}')
        if self.on_error == "skip" and not isinstance(self.error_ledger, str):
            raise ValueError('on_error="skip" writes each record skipped: give error_ledger=PATH')
        if self.max_errors < 0:
            raise ValueError(f"max_errors must be >= 0, got {self.max_errors}")
        if self.cache_limit < 1:
            raise ValueError(f"cache_limit must be >= 1 (bytes), got {self.cache_limit}")
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.image_size is not None:
            # an int is a square, as torchvision's Resize(32) and RandomResizedCrop(32)
            square = isinstance(self.image_size, numbers.Integral)
            iterable = square or hasattr(self.image_size, "__iter__")
            size = (self.image_size,) * 2 if square else tuple(self.image_size) if iterable else ()
            if len(size) != 2 or not all(_whole(v) and v >= 1 for v in size):
                raise ValueError(
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
                raise ValueError(
                    f"{name} must be (min, max) with 0 < min <= max"
                    f"{' <= 1' if top == 1.0 else ''}, got {pair!r}"
                )
            object.__setattr__(self, name, (low, high))
        if self.input_context is not None:
            if self.num_workers is not None or self.worker_index is not None:
                raise ValueError("give input_context or num_workers/worker_index, not both")
        elif (self.num_workers is None) != (self.worker_index is None):
            raise ValueError("num_workers and worker_index go together")
        elif self.num_workers is not None:
            if self.num_workers < 1:
                raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
            if not 0 <= self.worker_index < self.num_workers:
                raise ValueError(
                    f"worker_index must be in [0, {self.num_workers}), got {self.worker_index}"
                )

    def refuse(self, names: tuple[str, ...], reader: str, why: str) -> None:
        """A ``ValueError`` naming those of ``names`` set away from their defaults:
        options ``reader`` does not honour (``why`` says what to do instead)."""
        default = ReadOptions()
        changed = [n for n in names if getattr(self, n) != getattr(default, n)]
        if changed:
            raise ValueError(f"{reader} does not honour {', '.join(changed)}: {why}")

    def shuffles(self, split: str) -> bool:
        """Whether a read of ``split`` shuffles: ``shuffle``, by default "train" only."""
        return split == "train" if self.shuffle is None else self.shuffle

    def order(self, split: str) -> str:
        """The options that shape the read order of ``split``, as sorted ``name=value``
        pairs: a resumed read must be given the same (``ReadState.order``)."""
        shuffle = self.shuffles(split)
        shaping = {
            "shuffle": shuffle,
            "cycle_length": self.cycle_length or DEFAULT_CYCLE,
            "block_length": self.block_length,
            "random_crop": self.random_crop,
        }
        if self.random_crop:
            for name in ("crop_scale", "crop_ratio"):  # a value has no space in it
                shaping[name] = ",".join(repr(v) for v in getattr(self, name))
        if self.random_flip:
            shaping["random_flip"] = True
        if shuffle:
            shaping["shuffle_buffer"] = self.shuffle_buffer
        return " ".join(f"{k}={v}" for k, v in sorted(shaping.items()))

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

    def workers(self) -> tuple[int, int]:
        """(number of workers, this worker's index)."""
        if self.input_context is not None:
            ctx = self.input_context
            return ctx.num_input_pipelines, ctx.input_pipeline_id
        if self.num_workers is None:
            return 1, 0
        return self.num_workers, self.worker_index


def _whole(value) -> bool:
    """An int (numpy's too); 2.0 and True are mistakes."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
