"""``make_dataset``: a tf.data pipeline over one split of an evenshard dataset.

Order of stages (each one's reason in its comment):
files -> worker sharding -> runs of records in a seeded order (new each
epoch) -> round-robin interleave -> seeded window permutation -> epochs
joined -> batch -> parallel parse and decode -> prefetch (to the GPU when
there is one). The order is a pure function of (seed, epoch, position)
(``reader/order/plan.py``), so a read can start at any batch (``start_step``).
"""

from __future__ import annotations

import numpy as np

import schemas
from reader import tfcall
from reader.arrays import NumpyReader
from reader.cache import open_cache
from reader.decode import Decoder
from reader.info import check_path_root, default_path_root
from reader.mixture import Mixture
from reader.options import ReadOptions
from reader.read import Source, check_sized, check_state, merge, resolve
from reader.state import ReadState
from reader.stream import CHUNK, Stream, lead
from schemas import features, storage, tfrecord

tf = storage.tensorflow()


def make_dataset(
    data_dir: str | Mixture,
    split: str = "train",
    batch_size: int | None = 32,
    options: ReadOptions | None = None,
    *,
    state: ReadState | None = None,
    transform=None,
    views: int = 1,
    mirror_views: bool = False,
    num_processes: int | None = None,
    deal: tuple[int, int] = (1, 0),
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
        transform, views, mirror_views, num_processes: a Python ``transform(example,
            rng)`` run in ``num_processes`` worker processes on each image decoded once,
            ``views`` times, the views of an image together in a batch: the batches of
            :class:`reader.NumpyReader` as a dataset (``tf.data.Dataset.from_generator``).
            The transform's values must be arrays, numbers or strings.
        deal: (every, first): only batches first, first + every, ... of the read, the
            others never decoded (a DataLoader worker's share; ``TorchReader`` uses it).

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
    options = merge(options, overrides)
    check_state(state)
    if transform is not None or views != 1 or mirror_views:
        python = dict(transform=transform, views=views, mirror_views=mirror_views)
        return _preprocessed(data_dir, split, batch_size, options, state, python, num_processes)
    options.refuse(
        ("on_error",),
        "make_dataset (tf.data)",
        "a record fails there inside TensorFlow; read with reader.NumpyReader, "
        'TorchReader(backend="python" or "dali") or make_dali_pipeline',
    )
    read = resolve(data_dir, split, batch_size, options, state)
    check_sized(options, batch_size)
    o = read.options
    streams = [_source(source, o) for source in read.sources]
    records = streams[0]  # records, or (record, epoch) when augmenting
    if read.schedule is not None:
        choices = _choices(read.schedule, read.start)
        records = tf.data.Dataset.choose_from_datasets(streams, choices)
    deterministic = o.deterministic
    if deterministic is None:  # a state is a seeded read too
        deterministic = o.seed is not None or state is not None or not read.shuffled
    decoder = _decoder(read.sources[0], o, read.seed)
    parallel = {"num_parallel_calls": o.num_parallel_calls, "deterministic": deterministic}
    remaining = read.yields
    if deal != (1, 0) and batch_size is None:
        raise ValueError("deal= shares batches: give batch_size")
    if batch_size is None:
        if read.excluded:
            raise ValueError("the state excludes keys, whose rows are masked: give batch_size")
        ds = _skipping(records, read.skips).map(tfcall.graph(decoder.one), **parallel)
    else:
        # Parse whole batches at once (parse_example is vectorized: ~5x faster
        # than a parse per record), then decode the images of each batch.
        ds = records.batch(batch_size, drop_remainder=o.drop_remainder)
        ds = _skipping(ds, read.skips)
        every, first = deal
        if every > 1 and not o.pad_final_batch:  # dealt before decoding
            ds = ds.shard(every, first)
        ds = ds.map(tfcall.graph(decoder.batch), **parallel)
        if o.pad_final_batch:
            ds = _pad_batches(ds, batch_size, read.real_batches, read.remaining)
            if every > 1:  # padding counts the batches of the whole read
                ds = ds.shard(every, first)
        ds = _excluding(ds, read.excluded)
        if read.remaining is not None:
            remaining = len(range(first, read.yields, every))
    ds = ds.apply(
        tf.data.experimental.assert_cardinality(
            tf.data.INFINITE_CARDINALITY if remaining is None else remaining
        )
    )
    if o.as_supervised and (o.pad_final_batch or read.excluded):
        # Keras takes a third element as sample weights: padding rows weigh 0.
        ds = ds.map(
            tfcall.graph(lambda ex: (ex["image"], ex["label"], tf.cast(ex["mask"], tf.float32)))
        )
    elif o.as_supervised:
        ds = ds.map(tfcall.graph(lambda ex: (ex["image"], ex["label"])))
    ds = ds.with_options(_tf_options(deterministic))
    device = _prefetch_device(o.prefetch_to_device)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, o.prefetch or 1))
    elif o.prefetch is not None:
        ds = ds.prefetch(o.prefetch)
    return ds if state is None else (ds, read.state)


def _preprocessed(data_dir, split, batch_size, o, state, python: dict, processes):
    """``make_dataset`` with a Python transform: NumpyReader's batches as a dataset, each
    pass over it a new pass of the reader (Keras iterates once an epoch)."""
    if batch_size is None:
        raise ValueError("a transform runs on batches: give batch_size")
    if o.as_supervised or o.prefetch_to_device:
        raise ValueError(
            "with transform=, the dataset yields the transform's dicts: map them to "
            "(image, label) yourself; prefetch_to_device is not honoured"
        )
    numpy_reader = NumpyReader(
        data_dir,
        split,
        batch_size,
        o,
        num_processes=processes,
        state=state,
        **python,
    )
    start = ReadState.from_json(numpy_reader.state_dict()["read_state"])
    batches = iter(numpy_reader)
    first = next(batches)  # the signature: the transform's fields, types and shapes

    def signature(name, value):
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return tf.TensorSpec((None, *value.shape[1:]), value.dtype)
        if isinstance(value, list) and all(isinstance(v, (str, bytes)) for v in value):
            return tf.TensorSpec((None,), tf.string)
        held = " and ".join(sorted({type(v).__name__ for v in value})) + " values"
        shapes = sorted({v.shape for v in value if isinstance(v, np.ndarray)})
        if held == "ndarray values" and len(shapes) > 1:
            held = f"arrays of {len(shapes)} shapes ({', '.join(map(str, shapes[:3]))})"
        raise TypeError(
            f"transform output {name!r} holds {held}: make_dataset yields "
            "tensors (arrays of one shape, numbers or strings); reader.NumpyReader "
            "yields any values"
        )

    spec = {name: signature(name, value) for name, value in first.items()}

    def same(batch: dict) -> dict:
        """``batch``, its fields of the first batch's types: TensorFlow would cast a
        float field to a first batch's ints (0.5 read as 0)."""
        for name, s in spec.items():
            value = batch[name]
            if s.dtype == tf.string or (
                isinstance(value, np.ndarray)
                and np.can_cast(value.dtype, s.dtype.as_numpy_dtype, "same_kind")
            ):
                continue
            held = (
                value.dtype.name
                if isinstance(value, np.ndarray)
                else " and ".join(sorted({type(v).__name__ for v in value})) + " values"
            )
            raise TypeError(
                f"transform output {name!r} holds {held} in the batch of key "
                f"{batch['key'][0]!r}, {s.dtype.name} in the first batch: make_dataset "
                "yields one type a field; return the same type for every example "
                "(1.0, not 1, where others are 0.5)"
            )
        return batch

    def generate():
        nonlocal first, batches
        try:
            if first is not None:  # the pass begun for the signature
                head, rest = first, batches
                first = batches = None
                yield head
                yield from map(same, rest)
            else:
                yield from map(same, numpy_reader)
        except KeyboardInterrupt:  # Ctrl-C reached the read's processes; the read ended
            # The caller may wait inside TensorFlow, its own Ctrl-C pending there: an
            # error from here would race it (TensorFlow then raises a RuntimeError), an
            # empty batch lets it out to raise it. Had it no Ctrl-C, it sees the batch,
            # then this error.
            yield {
                name: np.zeros((0, *s.shape[1:]), s.dtype.as_numpy_dtype)
                for name, s in spec.items()
            }
            raise RuntimeError("the read was interrupted (Ctrl-C)") from None

    ds = tf.data.Dataset.from_generator(generate, output_signature=spec)
    try:
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(numpy_reader)))
    except TypeError:  # endless
        pass
    ds = ds.with_options(_tf_options(None))
    ds = ds.prefetch(o.prefetch) if o.prefetch is not None else ds
    return ds if state is None else (ds, start)


def _skipping(ds, skips: tuple):
    """``ds`` without its elements at the ``skips`` positions (a state's skipped steps:
    their records read raw, never parsed or decoded)."""
    if not skips:
        return ds
    firsts = tf.constant([a for a, _ in skips], tf.int64)
    stops = tf.constant([b for _, b in skips], tf.int64)
    kept = ds.enumerate().filter(
        tfcall.graph(lambda i, e: tf.logical_not(tf.reduce_any((firsts <= i) & (i < stops))))
    )
    return kept.map(tfcall.graph(lambda i, e: e))


def _excluding(ds, excluded: frozenset):
    """Batches whose rows of ``excluded`` keys are padding rows: ``mask`` False (added
    when missing), key "", every other value zero."""
    if not excluded:
        return ds
    keys = tf.constant(sorted(excluded))

    def mark(batch):
        kept = tf.logical_not(tf.reduce_any(tf.equal(batch["key"][:, None], keys[None, :]), 1))
        out = {}
        for name, v in batch.items():
            where = tf.reshape(kept, [-1] + [1] * (len(v.shape) - 1))
            out[name] = tf.where(where, v, tf.zeros_like(v))  # "" for strings
        out["mask"] = kept & batch["mask"] if "mask" in batch else kept
        return out

    return ds.map(tfcall.graph(mark))


def _tf_options(deterministic: bool | None):
    """The dataset's tf.data options: its determinism, and no autotuning model thread.

    tf.data's autotuner runs a model thread that wakes on a doubling period, up to a
    minute; deleting an iterator (the end of a ``for`` loop over the dataset)
    waits for that thread's wake-up. Reads of the 20,000-photo corpus waited 0 to
    10 s at their end, one read in two (1,850 img/s read as 972). Without it,
    AUTOTUNE parallelism is every core (tf.data's default) and prefetch buffers
    still grow by themselves; the same reads ran as fast (docs/design.md). A user
    may turn it back on with ``ds.with_options``.
    """
    tf_options = tf.data.Options()
    if deterministic is not None:
        tf_options.deterministic = deterministic
    tf_options.autotune.enabled = False
    return tf_options


def resume(data_dir: str, split: str, state: ReadState, options=None, **overrides):
    """A dataset that continues a seeded read from ``state``, and the state to advance:
    ``make_dataset(data_dir, split, state.batch_size, options, state=state)``.

    With the worker count of the run that saved it, the dataset yields exactly the
    batches the uninterrupted read would have yielded from ``state.step`` on (same
    keys, order, crops, padding and mask), without reading or decoding what it skips.
    With another worker count, the new workers first read, between them, exactly what
    the old ones had left of the epochs they had started (each such record once),
    then their own order from the next epoch (docs/design.md, "Elastic resume").

    Args:
        data_dir, split, options, overrides: as for ``reader.make_dataset``
            (``batch_size`` may be given to change it; ``seed`` comes from the state).
        state: a :class:`ReadState` (new, or from ``ReadState.from_json``).

    Returns:
        (dataset, state): advance the state by the batches consumed and save it.
    """
    batch_size = overrides.pop("batch_size", state.batch_size)
    return make_dataset(data_dir, split, batch_size, options, state=state, **overrides)


def _source(source: Source, o: ReadOptions):
    """One source's serialized records in its read order: its lead, then its own order
    (a bucket's shards through a local cache)."""
    share = source.share
    cache = open_cache(share, o)
    stream = Stream(share.plan, share.shards, source.info["compression"], o, cache)
    records = stream.records(share.start, o.epochs)
    if share.has_lead:
        records = lead(share, stream.tagged).concatenate(records)
    return records


def _choices(schedule, start: int):
    """The mixed stream's source indices from ``start`` on, computed a chunk at a time."""

    def chunk(i):
        return schedule.choices(start + int(i) * CHUNK, start + (int(i) + 1) * CHUNK)

    def chunks(i):
        out = tfcall.call(chunk, [i], tf.int64, stateful=False)
        out.set_shape([None])
        return out

    n = None if schedule.size is None else -(-(schedule.size - start) // CHUNK)
    indices = tf.data.Dataset.range(n) if n is not None else tf.data.Dataset.range(1 << 62)
    return indices.map(tfcall.graph(chunks)).unbatch()


def _decoder(source: Source, o: ReadOptions, seed):
    """The decoder of the records (of the first source of a mixture: they share the kind)."""
    kind = source.info["record_kind"]
    root = default_path_root(source.info, o.path_root)
    if kind == "path":
        first = tf.train.Example.FromString(
            next(tfrecord.iter_records(source.share.shards[0]["path"]))
        )
        check_path_root(
            root,
            first.features.feature[features.PATH].bytes_list.value[0].decode(),
            bool(o.path_root),
        )
    spec = schemas.feature_spec(schemas.load(source.data_dir))
    wanted = [features.payload(kind), features.LABEL, features.KEY, features.FORMAT]
    if o.augmenting:  # the boxes are drawn from the images' sizes
        wanted += [features.HEIGHT, features.WIDTH]
    return Decoder(
        kind,
        {name: spec[name] for name in wanted},
        root,
        o.decode,
        o.channels,
        o.image_size,
        o.augment(),
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

    ds = ds.map(tfcall.graph(pad))

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


def check_not_forked() -> None:
    """TensorFlow's runtime does not survive a fork: a DataLoader worker forked from a
    process where it had started hangs on its first op. Refuse, saying what works
    (``reader.torch`` calls it in a DataLoader worker)."""
    from tensorflow.python.eager import context

    if context.context()._context_handle is not None:  # started before the fork
        raise RuntimeError(
            "TorchReader(backend='tf') in a DataLoader worker forked from a process that "
            "had already started TensorFlow (TensorFlow hangs after a fork): use "
            "DataLoader(..., num_workers=0), or multiprocessing_context='spawn', or "
            "backend='dali'"
        )
