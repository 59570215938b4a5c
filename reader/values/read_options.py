"""``ReadOptions``: how a face reads a split, as one frozen, self-checking object: the
flat keywords users type, made of the groups a reader has (``reader/values/option_groups.py``)."""

from __future__ import annotations

import dataclasses

from reader.order.augment import Augment
from reader.values.option_groups import (
    AUTOTUNE,
    GROUPS,
    BatchOptions,
    BucketOptions,
    DeviceOptions,
    ErrorOptions,
    FormOptions,
    ImageOptions,
    OrderOptions,
    RecordOptions,
    ShardingOptions,
    TuningOptions,
    check_whole,
)
from schemas.errors import InvalidValueError

DEFAULT_CYCLE = 16  # runs read at once when cycle_length is None
MAX_POSITION = 2**62  # records and batches are counted in int64 (tf.data, numpy)
__all__ = ["AUTOTUNE", "DEFAULT_CYCLE", "MAX_POSITION", "ReadOptions"]


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Options of the faces (like TFDS ``ReadConfig``, Grain ``ReadOptions``), flat as
    users type them, made of groups: ``options.ordering``, ``.sharding``, ``.images``,
    ``.batches``, ``.form``, ``.bucket``, ``.tuning``, ``.device``, ``.errors``
    (``reader/values/option_groups.py``); each group checks itself. A face states the groups
    it takes; an option of another group is refused in one line. ``start_epoch`` and
    ``start_step`` are in no group: a read's start, which becomes its ``ReadState``.

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
        random_access: a shuffled epoch is one seeded permutation of the worker's
            records, new every epoch, each fetched by its place (offset) in its shard.
            None (default): wherever the shards allow it (local and uncompressed: their
            index holds every record's offset), else the runs and windows above (a
            bucket's shards, read through the bounded cache; gzip shards). False: the
            runs and windows everywhere (the order a bucket read gives, on a local
            copy). True: required (an error where the shards do not allow it).
            ``shuffle_buffer``, ``cycle_length`` and ``block_length`` shape the runs and
            windows only.
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
            read, so each byte is downloaded once an epoch (``reader/cache/shard_cache.py``).
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
            gone, or its image not decodable): "raise" (default) stops the read;
            "skip" (the Python route: ``NumpyReader``, ``make_dataset``,
            ``TorchReader`` python, its default then; and DALI, for records that fail
            to parse, its decoder meeting the image first) gives its row as a padding
            row (``mask`` False) and writes it once to ``error_ledger`` (a JSON line:
            key, shard, offset, reason, epoch, step).
        max_errors: with "skip", the read stops (one line naming the ledger) at the
            record after this many.
        error_ledger: the file the skipped records are appended to.
        features: records that are not images (``record_kind: "example"``): the
            features to parse, ``{name: tf.io.FixedLenFeature(...)}`` or
            ``reader.examples.Feature``; None: the dataset's ``schema.pbtxt``.
    """

    # The groups' fields, flat as users type them (so an editor offers them): each
    # also in its group, which checks it and holds its default, written there once
    # (test_option_groups pins that they agree).
    shuffle: bool | None = OrderOptions.shuffle
    seed: int | None = OrderOptions.seed
    epochs: int | None = OrderOptions.epochs
    shuffle_buffer: int = OrderOptions.shuffle_buffer
    cycle_length: int | None = OrderOptions.cycle_length
    block_length: int = OrderOptions.block_length
    deterministic: bool | None = OrderOptions.deterministic
    random_access: bool | None = OrderOptions.random_access
    decode: bool = ImageOptions.decode
    image_size: tuple[int, int] | None = ImageOptions.image_size
    channels: int = ImageOptions.channels
    random_crop: bool = ImageOptions.random_crop
    crop_scale: tuple[float, float] = ImageOptions.crop_scale
    crop_ratio: tuple[float, float] = ImageOptions.crop_ratio
    random_flip: bool = ImageOptions.random_flip
    input_context: object = ShardingOptions.input_context
    num_workers: int | None = ShardingOptions.num_workers
    worker_index: int | None = ShardingOptions.worker_index
    drop_remainder: bool = BatchOptions.drop_remainder
    pad_final_batch: bool = BatchOptions.pad_final_batch
    as_supervised: bool = FormOptions.as_supervised
    path_root: str | None = ImageOptions.path_root
    cache: bool = TuningOptions.cache
    cache_dir: str | None = BucketOptions.cache_dir
    cache_limit: int = BucketOptions.cache_limit
    start_epoch: int = 0
    start_step: int = 0
    prefetch: int | None = TuningOptions.prefetch
    prefetch_to_device: str | bool | None = DeviceOptions.prefetch_to_device
    num_parallel_calls: int = TuningOptions.num_parallel_calls
    on_error: str = ErrorOptions.on_error
    max_errors: int = ErrorOptions.max_errors
    error_ledger: str | None = ErrorOptions.error_ledger
    features: dict | None = RecordOptions.features

    def __post_init__(self) -> None:
        groups = {}
        for name, group in GROUPS.items():
            fields = [f.name for f in dataclasses.fields(group)]
            made = group(**{field: getattr(self, field) for field in fields})
            for field in fields:  # as the group normalized it (image_size (h, w), ...)
                object.__setattr__(self, field, getattr(made, field))
            groups[name] = made
        object.__setattr__(self, "_groups", groups)
        check_whole(self, "start_epoch", "start_step")
        for name in ("start_epoch", "start_step"):
            if getattr(self, name) >= MAX_POSITION:
                raise InvalidValueError(f"{name} must be below 2**62, got {getattr(self, name)}")
        if self.start_step < 0 or self.start_epoch < 0:
            raise InvalidValueError(
                f"start_epoch and start_step must be >= 0, got {self.start_epoch}, "
                f"{self.start_step}"
            )

    def shuffles(self, split: str) -> bool:
        """Whether a read of ``split`` shuffles: ``shuffle``, by default "train" only."""
        return split == "train" if self.shuffle is None else self.shuffle

    def order(self, split: str, by_place: bool = False) -> str:
        """The options that shape the read order of ``split``, as sorted ``name=value``
        pairs: a resumed read must be given the same (``ReadState.order``). ``by_place``:
        the shards are read by place (``random_access``), each epoch one permutation,
        which the runs' and windows' options do not shape (a state saved before, by
        runs, names none: resumed with ``random_access=False``)."""
        shuffle = self.shuffles(split)
        shaping = {"shuffle": shuffle, "random_crop": self.random_crop}
        if shuffle and by_place:
            shaping["random_access"] = True
        else:
            shaping["cycle_length"] = self.cycle_length or DEFAULT_CYCLE
            shaping["block_length"] = self.block_length
        if self.random_crop:
            for name in ("crop_scale", "crop_ratio"):  # a value has no space in it
                shaping[name] = ",".join(repr(v) for v in getattr(self, name))
        if self.random_flip:
            shaping["random_flip"] = True
        if shuffle and not by_place:
            shaping["shuffle_buffer"] = self.shuffle_buffer
        return " ".join(f"{k}={v}" for k, v in sorted(shaping.items()))

    @property
    def augmenting(self) -> bool:
        """Whether built-in augmentations run (their draws need the seed and epoch)."""
        return self.images.augmenting

    def augment(self, mirror: bool = False) -> Augment | None:
        """The built-in augmentations asked for (``mirror``: views in mirrored pairs), or
        None."""
        return self.images.augment(mirror)

    def workers(self) -> tuple[int, int]:
        """(number of workers, this worker's index)."""
        return self.sharding.workers()


def _group(name: str) -> property:
    return property(lambda options: options._groups[name], doc=GROUPS[name].__doc__)


for _name in GROUPS:  # options.ordering, options.images, ...: the groups, as made
    setattr(ReadOptions, _name, _group(_name))
