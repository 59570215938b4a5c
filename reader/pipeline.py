"""``make_dataset``: a tf.data pipeline over one split of an evenshard dataset.

Order of stages (each one's reason in its comment):
files -> worker sharding -> seeded file shuffle (new order each epoch) ->
parallel interleave -> shuffle buffer -> repeat -> parallel parse and decode
-> batch -> prefetch (to the GPU when there is one).
"""

from __future__ import annotations

import logging
import math

from reader.info import DatasetError, default_path_root, load_info, split_shards

log = logging.getLogger(__name__)

AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow at import time


def _workers(input_context, num_workers, worker_index) -> tuple[int, int]:
    if input_context is not None:
        if num_workers is not None or worker_index is not None:
            raise ValueError("give input_context or num_workers/worker_index, not both")
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    if (num_workers is None) != (worker_index is None):
        raise ValueError("num_workers and worker_index go together")
    if num_workers is None:
        return 1, 0
    if not (num_workers >= 1 and 0 <= worker_index < num_workers):
        raise ValueError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    return num_workers, worker_index


def worker_plan(shards: list[dict], num_workers: int, worker_index: int):
    """Which files a worker reads, and how many examples it gets.

    Files are dealt round-robin (disjoint). With fewer files than workers,
    every worker reads all files and keeps every num_workers-th record.

    Returns:
        (files, examples of this worker, record-level stride)
    """
    if len(shards) < num_workers:
        total = sum(s["num_examples"] for s in shards)
        return shards, len(range(worker_index, total, num_workers)), num_workers
    mine = shards[worker_index::num_workers]
    return mine, sum(s["num_examples"] for s in mine), 1


def _warn_uneven(split: str, n_files: int, num_workers: int) -> None:
    if n_files < num_workers:
        log.warning(
            "split %s has %d shards for %d workers: every worker reads every shard "
            "and keeps 1 record in %d; convert with --shard_multiple %d to read "
            "disjoint files",
            split,
            n_files,
            num_workers,
            num_workers,
            num_workers,
        )
    elif n_files % num_workers:
        log.warning(
            "split %s has %d shards, not a multiple of %d workers: workers get "
            "unequal example counts; convert with --shard_multiple %d to fix it",
            split,
            n_files,
            num_workers,
            num_workers,
        )


def make_dataset(
    data_dir: str,
    split: str = "train",
    batch_size: int | None = 32,
    *,
    shuffle: bool | None = None,
    seed: int | None = None,
    epochs: int | None = 1,
    shuffle_buffer: int = 1000,
    cycle_length: int | None = None,
    block_length: int = 1,
    deterministic: bool | None = None,
    decode: bool = True,
    image_size: tuple[int, int] | None = None,
    channels: int = 3,
    random_crop: bool = False,
    input_context=None,
    num_workers: int | None = None,
    worker_index: int | None = None,
    drop_remainder: bool = False,
    pad_final_batch: bool = False,
    as_supervised: bool = False,
    path_root: str | None = None,
    cache: bool = False,
    prefetch: int | None = AUTOTUNE,
    prefetch_to_device: str | bool | None = None,
    num_parallel_calls: int = AUTOTUNE,
):
    """Builds a ``tf.data.Dataset`` over one split, from ``dataset_info.json``.

    Args:
        data_dir: a folder written by ``evenshard convert`` (local or gs://).
        split: split name.
        batch_size: examples a batch; None yields single examples.
        shuffle: shuffle files and examples; default True for "train" only.
        seed: makes every shuffle reproducible; also turns ``deterministic`` on.
        epochs: passes over the split; None repeats forever.
        shuffle_buffer: examples in the shuffle buffer (0: files and
            interleave only; the shards are already globally shuffled).
        cycle_length: files read at once (default: min(16, files)).
        block_length: consecutive records taken from a file in turn.
        deterministic: fixed output order. Default: True with a seed or without
            shuffling (evaluation reads in one fixed order, the short batch last);
            False only for unseeded shuffling, whose order is random anyway.
        decode: decode images (False: ``image`` holds the encoded bytes).
        image_size: (height, width) to resize to; needed to batch decoded
            images, whose sizes differ.
        channels: channels of decoded images (1, 3 or 4).
        random_crop: crop a random box (JPEG decodes only the box) before resizing.
        input_context: a ``tf.distribute.InputContext``; or give
            ``num_workers`` and ``worker_index``.
        drop_remainder: drop a final partial batch.
        pad_final_batch: pad the final batch to ``batch_size`` and add a boolean
            ``mask`` feature (False on padding): static shapes for evaluation.
        as_supervised: yield (image, label) instead of a dict.
        path_root: path kind: the folder the stored paths are relative to
            (default: the one recorded at conversion).
        cache: cache parsed records in memory after the first epoch (before
            shuffling buffers; small datasets only).
        prefetch: batches to prefetch (None: no prefetch).
        prefetch_to_device: a device name such as "/gpu:0", True for the first
            GPU; default: the first GPU when one is visible.
        num_parallel_calls: parallelism of interleave and decode.

    Returns:
        A dataset of dicts ``{"image", "label", "key"}`` (plus ``"mask"`` with
        ``pad_final_batch``), or (image, label) tuples; finite datasets carry
        their cardinality.

    Raises:
        DatasetError: the dataset is missing, unfinished, or a listed shard is
            missing or has the wrong size. A shard whose records turn out to
            be corrupt raises ``tf.errors.InvalidArgumentError`` naming the file
            when it is read.
        ValueError: options that do not fit together.
    """
    import tensorflow as tf

    import schemas

    info = load_info(data_dir)
    shards = split_shards(info, data_dir, split)
    shuffle = (split == "train") if shuffle is None else shuffle
    if deterministic is None:
        deterministic = seed is not None or not shuffle
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
    if pad_final_batch and (batch_size is None or drop_remainder):
        raise ValueError("pad_final_batch needs a batch_size and drop_remainder=False")
    if pad_final_batch and (shuffle or epochs != 1):
        raise ValueError("pad_final_batch is for evaluation: use shuffle=False, epochs=1")
    if decode and batch_size is not None and image_size is None:
        raise ValueError(
            "decoded images differ in size: give image_size=(height, width) to "
            "batch them, or batch_size=None, or decode=False"
        )
    if channels not in (1, 3, 4):
        raise ValueError(f"channels must be 1, 3 or 4, got {channels}")
    if not shards:
        raise DatasetError(f"split {split!r} of {data_dir} has no examples")
    n_workers, index = _workers(input_context, num_workers, worker_index)
    _warn_uneven(split, len(shards), n_workers)
    mine, num_examples, stride = worker_plan(shards, n_workers, index)
    if seed is None and shuffle:
        seed = int(tf.random.uniform([], maxval=2**31 - 1, dtype=tf.int64))  # a fresh one
    compression = "GZIP" if info["compression"] == "gzip" else ""
    kind = info["record_kind"]
    root = default_path_root(info, path_root)
    spec = schemas.feature_spec(schemas.load(f"{data_dir.rstrip('/')}/schema.pbtxt"))
    wanted = [
        "image/encoded" if kind == "image" else "image/path",
        "image/class/label",
        "image/key",
        "image/format",
    ]
    spec = {name: spec[name] for name in wanted}

    paths = tf.constant([s["path"] for s in mine])
    counts = tf.constant([s["num_examples"] for s in mine], tf.int64)
    files = tf.data.Dataset.from_tensor_slices((paths, counts))
    if shuffle:
        # A new file order every epoch: the repeat below re-runs this shuffle.
        files = files.shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
    cycle = min(cycle_length or 16, len(mine))
    parallel = cycle > 1
    records = files.interleave(
        lambda path, count: _checked_records(tf, path, count, compression),
        cycle_length=cycle,
        block_length=block_length,
        num_parallel_calls=num_parallel_calls if parallel else None,
        deterministic=deterministic if parallel else None,
    )
    if stride > 1:
        records = records.shard(stride, index)
    if cache:
        records = records.cache()
    if shuffle and shuffle_buffer > 0:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if epochs != 1:
        records = records.repeat(epochs)

    decoder = _Decoder(tf, kind, spec, root, decode, channels, image_size, random_crop, seed)
    if batch_size is None:
        ds = records.map(
            decoder.one, num_parallel_calls=num_parallel_calls, deterministic=deterministic
        )
        if epochs is not None:
            ds = ds.apply(tf.data.experimental.assert_cardinality(num_examples * epochs))
    else:
        # Parse whole batches at once (parse_example is vectorized: ~5x faster
        # than a parse per record), then decode the images of each batch.
        ds = records.batch(batch_size, drop_remainder=drop_remainder)
        ds = ds.map(
            decoder.batch, num_parallel_calls=num_parallel_calls, deterministic=deterministic
        )
        if pad_final_batch:
            # Every worker yields the same batch count, so collective evaluation
            # steps never wait on a worker that ran out.
            most = max(worker_plan(shards, n_workers, w)[1] for w in range(n_workers))
            ds = _pad_batches(
                tf,
                ds,
                batch_size,
                math.ceil(num_examples / batch_size),
                math.ceil(most / batch_size),
            )
        if epochs is not None:
            # Batches come after repeat, so they run across epoch boundaries.
            total = num_examples * epochs
            batches = total // batch_size if drop_remainder else math.ceil(total / batch_size)
            if pad_final_batch:  # only with epochs == 1
                batches = math.ceil(most / batch_size)
            ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    if as_supervised:
        ds = ds.map(lambda ex: (ex["image"], ex["label"]))
    options = tf.data.Options()
    options.deterministic = deterministic
    ds = ds.with_options(options)
    device = _prefetch_device(tf, prefetch_to_device)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, prefetch or 1))
    elif prefetch is not None:
        ds = ds.prefetch(prefetch)
    return ds


def _checked_records(tf, path, expected, compression):
    """The records of one shard; a corrupt or short shard raises an error naming it.

    TensorFlow's own DataLossError does not say which file failed. Here a read
    error ends the file (``ignore_errors``), and a sentinel that raises an
    error naming the shard follows its records; ``take(expected)`` stops
    before the sentinel when every record listed in dataset_info.json was
    read, and reaches it only when the shard came up short. All of it runs in
    tf.data's C++ ops: no Python function per record (a per-record check cost
    90% of the read rate, a per-chunk one 40%).
    """
    records = tf.data.TFRecordDataset(
        path, compression_type=compression, buffer_size=1 << 20
    ).ignore_errors()

    def fail(shard):
        check = tf.debugging.Assert(
            tf.constant(False),
            [
                "evenshard: shard",
                shard,
                "is corrupt (CRC mismatch or truncated): it holds fewer good records than the",
                expected,
                "listed in dataset_info.json",
            ],
        )
        with tf.control_dependencies([check]):
            return tf.constant(b"")

    sentinel = tf.data.Dataset.from_tensors(path).map(fail)
    return records.concatenate(sentinel).take(expected)


class _Decoder:
    """Parses records (one, or a batch at once) and decodes their images."""

    def __init__(self, tf, kind, spec, root, decode, channels, image_size, random_crop, seed):
        self.tf, self.kind, self.spec, self.root = tf, kind, spec, root
        self.decode, self.channels, self.image_size = decode, channels, image_size
        self.random_crop, self.seed = random_crop, seed

    def _data(self, ex):
        if self.kind == "image":
            return ex["image/encoded"]
        return self.tf.io.read_file(self.tf.strings.join([self.root, "/", ex["image/path"]]))

    def _image(self, ex):
        data = self._data(ex)
        if not self.decode:
            return data
        return _decode(
            self.tf,
            data,
            ex["image/format"],
            self.channels,
            self.image_size,
            self.random_crop,
            self.seed,
        )

    def _features(self, ex, image):
        out = {"image": image, "label": ex["image/class/label"], "key": ex["image/key"]}
        if self.kind == "path":
            out["path"] = ex["image/path"]
        return out

    def one(self, serialized):
        ex = self.tf.io.parse_single_example(serialized, self.spec)
        ex = {k: self.tf.squeeze(v, 0) for k, v in ex.items()}
        return self._features(ex, self._image(ex))

    def batch(self, serialized):
        tf = self.tf
        ex = tf.io.parse_example(serialized, self.spec)
        ex = {k: tf.squeeze(v, 1) for k, v in ex.items()}
        if self.decode:
            signature = tf.TensorSpec([*self.image_size, self.channels], tf.uint8)
        else:
            signature = tf.TensorSpec([], tf.string)
        if self.kind == "image" and not self.decode:
            images = ex["image/encoded"]
        else:
            names = [k for k in ("image/encoded", "image/path", "image/format") if k in ex]
            images = tf.map_fn(
                lambda one: self._image(dict(zip(names, one))),
                tuple(ex[k] for k in names),
                fn_output_signature=signature,
            )
        return self._features(ex, images)


def _pad_batches(tf, ds, batch_size: int, real_batches: int, total_batches: int):
    """Pads the last batch to ``batch_size`` and appends all-padding batches up to
    ``total_batches``; a boolean ``mask`` is False on padding."""

    def pad(batch):
        n = tf.shape(batch["label"])[0]
        out = {}
        for k, v in batch.items():
            widths = [[0, batch_size - n]] + [[0, 0]] * (len(v.shape) - 1)
            out[k] = tf.ensure_shape(tf.pad(v, widths), [batch_size, *v.shape[1:]])
        out["mask"] = tf.range(batch_size) < n
        return out

    ds = ds.map(pad)

    def zeros(spec):
        if not spec.shape.is_fully_defined():
            raise ValueError("pad_final_batch needs fixed shapes: give image_size")
        return tf.zeros(spec.shape, spec.dtype)

    if total_batches > real_batches:
        empty = tf.nest.map_structure(zeros, ds.element_spec)
        empty["mask"] = tf.zeros([batch_size], tf.bool)
        ds = ds.concatenate(
            tf.data.Dataset.from_tensors(empty).repeat(total_batches - real_batches)
        )
    return ds


def _decode(tf, data, fmt, channels, image_size, random_crop, seed):
    if random_crop:
        image = _decode_random_crop(tf, data, fmt, channels, seed)
    else:
        image = _decode_full(tf, data, fmt, channels)
    if image_size is not None:
        image = tf.image.resize(image, image_size)
        image = tf.saturate_cast(tf.round(image), tf.uint8)
    return image


def _decode_random_crop(tf, data, fmt, channels, seed):
    """Random crop (8%-100% of the area, 3/4-4/3 aspect); JPEG decodes only the crop."""

    def box(shape):
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            tf.zeros([0, 0, 4]),
            seed=tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32, seed=seed),
            min_object_covered=0.08,
            aspect_ratio_range=(0.75, 1.33),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, size

    def jpeg():
        begin, size = box(tf.image.extract_jpeg_shape(data))
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        cropped = tf.image.decode_and_crop_jpeg(data, window, channels=3 if channels == 3 else 0)
        return _to_channels(tf, cropped, channels)

    def other():
        image = _decode_full(tf, data, fmt, channels)
        begin, size = box(tf.shape(image))
        return tf.slice(image, begin, size)

    image = tf.cond(tf.equal(fmt, "jpeg"), jpeg, other)
    image.set_shape([None, None, channels])
    return image


def _decode_full(tf, data, fmt, channels):
    """Decodes any supported format to ``channels`` channels.

    Decoders differ in the channel counts they accept (GIF gives RGB only,
    WebP 3 or 4, libjpeg cannot turn CMYK into gray), so images are decoded
    as stored and converted here. JPEG asked for 3 channels decodes straight
    to RGB (CMYK included) in libjpeg: the common case, and the fastest.
    """
    if channels == 3:
        image = tf.cond(
            tf.equal(fmt, "jpeg"),
            lambda: tf.io.decode_jpeg(data, channels=3),
            lambda: _to_channels(tf, _decode_native(tf, data), 3),
        )
    else:
        image = _to_channels(tf, _decode_native(tf, data), channels)
    image.set_shape([None, None, channels])
    return image


def _decode_native(tf, data):
    # expand_animations=False: the first frame of a GIF/WebP, always 3-D.
    return tf.io.decode_image(data, channels=0, expand_animations=False)


def _to_channels(tf, image, channels):
    """Converts an image of 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA) channels."""
    c = tf.shape(image)[-1]
    gray = image[..., :1]
    rgb = tf.cond(c >= 3, lambda: image[..., :3], lambda: tf.tile(gray, [1, 1, 3]))
    if channels == 3:
        return rgb
    if channels == 1:
        return tf.cond(c >= 3, lambda: tf.image.rgb_to_grayscale(rgb), lambda: gray)
    opaque = tf.fill(tf.shape(gray), tf.constant(255, image.dtype))
    alpha = tf.case(
        [(tf.equal(c, 4), lambda: image[..., 3:4]), (tf.equal(c, 2), lambda: image[..., 1:2])],
        default=lambda: opaque,
    )
    return tf.concat([rgb, alpha], axis=-1)


def _prefetch_device(tf, prefetch_to_device):
    if prefetch_to_device is False:
        return None
    if isinstance(prefetch_to_device, str):
        return prefetch_to_device
    gpus = tf.config.list_logical_devices("GPU")
    if prefetch_to_device is True and not gpus:
        raise ValueError("prefetch_to_device=True but no GPU is visible")
    return gpus[0].name if gpus else None
