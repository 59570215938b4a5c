"""``make_dataset``: a tf.data pipeline over one split of an evenshard dataset.

Order of stages (each one's reason in its comment):
files -> worker sharding -> runs of records in a seeded order (new each
epoch) -> round-robin interleave -> seeded window permutation -> epochs
joined -> batch -> parallel parse and decode -> prefetch (to the GPU when
there is one). The order is a pure function of (seed, epoch, position)
(``reader/plan.py``), so a read can start at any batch (``start_step``).
"""

from __future__ import annotations

import dataclasses

import schemas
from reader.cache import open_cache
from reader.decode import Decoder
from reader.info import check_path_root, default_path_root
from reader.mixture import MixRead, Mixture
from reader.options import ReadOptions
from reader.state import ReadState
from reader.stream import CHUNK, Stream, lead
from reader.worker import WorkerRead
from schemas import features, storage, tfrecord
from schemas.info import load_info

tf = storage.tensorflow()


def make_dataset(
    data_dir: str | Mixture,
    split: str = "train",
    batch_size: int | None = 32,
    options: ReadOptions | None = None,
    *,
    state: ReadState | None = None,
    **overrides,
):
    """Builds a ``tf.data.Dataset`` over one split, from ``dataset_info.json``.

    Args:
        data_dir: a folder written by ``evenshard convert`` (local or gs://), or a
            ``reader.mix`` of several splits (then ``split`` is not used).
        split: split name.
        batch_size: examples a batch; None yields single examples.
        options: a :class:`ReadOptions`; default ``ReadOptions()``.
        state: a :class:`reader.ReadState` to resume, with this worker count or
            another (``reader.resume`` takes it from here; ``seed`` and the start
            come from it).
        **overrides: fields of ``ReadOptions`` to change, e.g. ``seed=0,
            image_size=(224, 224)``.

    Returns:
        A dataset of dicts ``{"image", "label", "key"}`` (plus ``"mask"`` with
        ``pad_final_batch``), or (image, label) tuples; finite datasets carry
        their cardinality. With ``state``: (dataset, the state to advance by the
        batches consumed).

    Raises:
        DatasetError: the dataset is missing, unfinished, or a listed shard is
            missing or has the wrong size. A shard whose records turn out to
            be corrupt raises ``tf.errors.InvalidArgumentError`` naming the file
            when it is read.
        ValueError: options that do not fit together.
    """
    o = dataclasses.replace(options or ReadOptions(), **overrides)
    if isinstance(data_dir, Mixture):
        read = MixRead.of(data_dir, batch_size, o, state)
        parts = read.parts
        shuffled = any(w.shuffle for *_, w in parts)
        streams = [_source(info, w, o) for info, _, _, w in parts]
        choices = _choices(read.schedule, read.start)
        records = tf.data.Dataset.choose_from_datasets(streams, choices)
    else:
        info = load_info(data_dir)
        read = WorkerRead.of(info, data_dir, split, batch_size, o, state)
        parts, shuffled = [(info, data_dir, split, read)], read.shuffle
        records = _source(info, read, o)  # records, or (record, epoch) with random_crop
    deterministic = o.deterministic
    if deterministic is None:  # a state is a seeded read too
        deterministic = o.seed is not None or state is not None or not shuffled
    decoder = _decoder(*parts[0], o, read.seed)
    parallel = {"num_parallel_calls": o.num_parallel_calls, "deterministic": deterministic}
    if batch_size is None:
        ds = records.map(decoder.one, **parallel)
    else:
        # Parse whole batches at once (parse_example is vectorized: ~5x faster
        # than a parse per record), then decode the images of each batch.
        ds = records.batch(batch_size, drop_remainder=o.drop_remainder)
        ds = ds.map(decoder.batch, **parallel)
        if o.pad_final_batch:
            ds = _pad_batches(ds, batch_size, read.real_batches, read.remaining)
    ds = ds.apply(
        tf.data.experimental.assert_cardinality(
            tf.data.INFINITE_CARDINALITY if read.remaining is None else read.remaining
        )
    )
    if o.as_supervised and o.pad_final_batch:
        # Keras takes a third element as sample weights: padding rows weigh 0.
        ds = ds.map(lambda ex: (ex["image"], ex["label"], tf.cast(ex["mask"], tf.float32)))
    elif o.as_supervised:
        ds = ds.map(lambda ex: (ex["image"], ex["label"]))
    tf_options = tf.data.Options()
    tf_options.deterministic = deterministic
    ds = ds.with_options(tf_options)
    device = _prefetch_device(o.prefetch_to_device)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, o.prefetch or 1))
    elif o.prefetch is not None:
        ds = ds.prefetch(o.prefetch)
    return ds if state is None else (ds, read.state)


def _source(info: dict, w: WorkerRead, o: ReadOptions):
    """One source's serialized records in its read order: its lead, then its own order
    (a bucket's shards through a local cache)."""
    cache = open_cache(w, o)
    stream = Stream(w.plan, w.shards, info["compression"], o, cache)
    records = stream.records(w.start, o.epochs)
    if w.lead is not None and len(w.lead[0]):
        records = lead(w, stream.tagged).concatenate(records)
    return records


def _choices(schedule, start: int):
    """The mixed stream's source indices from ``start`` on, computed a chunk at a time."""

    def chunk(i):
        return schedule.choices(start + int(i) * CHUNK, start + (int(i) + 1) * CHUNK)

    def chunks(i):
        out = tf.numpy_function(chunk, [i], tf.int64, stateful=False)
        out.set_shape([None])
        return out

    n = None if schedule.size is None else -(-(schedule.size - start) // CHUNK)
    indices = tf.data.Dataset.range(n) if n is not None else tf.data.Dataset.range(1 << 62)
    return indices.map(chunks).unbatch()


def _decoder(info: dict, data_dir: str, split: str, w: WorkerRead, o: ReadOptions, seed):
    """The decoder of the records (of the first source of a mixture: they share the kind)."""
    kind = info["record_kind"]
    root = default_path_root(info, o.path_root)
    if kind == "path":
        first = tf.train.Example.FromString(next(tfrecord.iter_records(w.shards[0]["path"])))
        check_path_root(
            root,
            first.features.feature[features.PATH].bytes_list.value[0].decode(),
            bool(o.path_root),
        )
    spec = schemas.feature_spec(schemas.load(data_dir))
    wanted = [features.payload(kind), features.LABEL, features.KEY, features.FORMAT]
    return Decoder(
        kind,
        {name: spec[name] for name in wanted},
        root,
        o.decode,
        o.channels,
        o.image_size,
        o.random_crop,
        seed,
    )


def _pad_batches(ds, batch_size: int, real_batches: int, total_batches: int):
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


def _prefetch_device(prefetch_to_device):
    if prefetch_to_device is False:
        return None
    if isinstance(prefetch_to_device, str):
        return prefetch_to_device
    gpus = tf.config.list_logical_devices("GPU")
    if prefetch_to_device is True and not gpus:
        raise ValueError("prefetch_to_device=True but no GPU is visible")
    return gpus[0].name if gpus else None
