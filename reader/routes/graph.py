"""The tf graph stream: a resolved :class:`reader.front.read.Read` as a ``tf.data.Dataset``.

The spine's tf.data route, which ``make_dataset`` and ``TorchReader(backend="tf")``
both stand on. Order of stages (each one's reason in its comment):
files -> worker sharding -> runs of records in a seeded order (new each
epoch) -> round-robin interleave -> seeded window permutation -> epochs
joined -> batch -> dealt to a DataLoader worker -> parallel parse and decode
(``reader/decode/tf_decode.py``: the one place a record kind picks its decode) -> padding
-> prefetch (to the GPU when there is one). The order is a pure function of
(seed, epoch, position) (``reader/order/plan.py``), so a read can start at any batch.
"""

from __future__ import annotations

import schemas
from reader.cache.shard_cache import open_cache
from reader.decode.tf_decode import Decoder, ExampleDecoder
from reader.front.read import Read, Source
from reader.records import tfcall
from reader.records.example_batches import read_spec
from reader.records.stream import CHUNK, Stream, lead, named
from reader.values.read_options import ReadOptions
from reader.values.split_shards import check_path_root, default_path_root
from schemas import features, storage, tfrecord
from schemas.errors import InvalidValueError, OperationError

tf = storage.tensorflow()


def dataset(read: Read, resumed: bool = False, deal: tuple[int, int] = (1, 0)):
    """The dataset of ``read``: its records decoded and batched (``read.batch_size``;
    None: single examples), padded, prefetched.

    Args:
        read: what this worker reads (``reader.front.read.resolve``).
        resumed: the read was given a state (a seeded read: deterministic by default).
        deal: (every, first): only batches first, first + every, ... of the read, the
            others never decoded (a DataLoader worker's share).
    """
    o, batch_size = read.options, read.batch_size
    streams = [_source(source, o) for source in read.sources]
    records = streams[0]  # records, or (record, epoch) when augmenting
    if read.schedule is not None:
        choices = _choices(read.schedule, read.start)
        records = tf.data.Dataset.choose_from_datasets(streams, choices)
    deterministic = o.deterministic
    if deterministic is None:  # a state is a seeded read too
        deterministic = o.seed is not None or resumed or not read.shuffled
    decoder = _decoder(read.sources, o, read.seed)
    parallel = {"num_parallel_calls": o.num_parallel_calls, "deterministic": deterministic}
    remaining = read.yields
    if deal != (1, 0) and batch_size is None:
        raise InvalidValueError("deal= shares batches: give batch_size")
    if batch_size is None:
        if read.excluded:
            raise InvalidValueError(
                "the state excludes keys, whose rows are masked: give batch_size"
            )
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
    if o.as_supervised:
        ds = supervised(ds, weighted=bool(o.pad_final_batch or read.excluded))
    ds = ds.with_options(tf_options(deterministic))
    device = _prefetch_device(o.prefetch_to_device)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, o.prefetch or 1))
    elif o.prefetch is not None:
        ds = ds.prefetch(o.prefetch)
    return named(ds)


def supervised(ds, weighted: bool):
    """``ds``'s batches as (image, label), or (image, label, weight) where a row can be
    masked (``weighted``): Keras takes a third element as sample weights, a masked row
    weighing 0. The graph's and the Python route's datasets alike."""
    if weighted:
        return ds.map(
            tfcall.graph(lambda ex: (ex["image"], ex["label"], tf.cast(ex["mask"], tf.float32)))
        )
    return ds.map(tfcall.graph(lambda ex: (ex["image"], ex["label"])))


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

        def zeroed(v):
            where = tf.reshape(kept, [-1] + [1] * (len(v.shape) - 1))
            return tf.where(where, v, tf.zeros_like(v))  # "" for strings

        out = tf.nest.map_structure(zeroed, batch)  # a Padded's values and lengths too
        out["mask"] = kept & batch["mask"] if "mask" in batch else kept
        return out

    return ds.map(tfcall.graph(mark))


def tf_options(deterministic: bool | None):
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


def _source(source: Source, o: ReadOptions):
    """One source's serialized records in its read order: its lead, then its own order
    (a bucket's shards through a local cache)."""
    share = source.share
    cache = open_cache(share, o)
    stream = Stream(share.plan, share.shards, source.info.compression, o, cache)
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


def _decoder(sources: tuple[Source, ...], o: ReadOptions, seed):
    """The decoder of the records (of the first source of a mixture: they share the kind)."""
    source = sources[0]
    kind = source.info.record_kind
    if kind == "example":  # records that are not images: parsed, nothing decoded
        return ExampleDecoder(*read_spec(sources, o.features))
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
        n = tf.shape(tf.nest.flatten(batch)[0])[0]

        def padded(v):
            widths = [[0, batch_size - n]] + [[0, 0]] * (len(v.shape) - 1)
            return tf.ensure_shape(tf.pad(v, widths), [batch_size, *v.shape[1:]])

        out = tf.nest.map_structure(padded, batch)  # a Padded's values and lengths too
        out["mask"] = tf.range(batch_size) < n
        return out

    ds = ds.map(tfcall.graph(pad))

    def zeros(spec):
        if not spec.shape[:1].concatenate(spec.shape[2:]).is_fully_defined():
            raise InvalidValueError("pad_final_batch needs fixed shapes: give image_size")
        return tf.zeros([d or 0 for d in spec.shape], spec.dtype)  # a Padded: 0 wide

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
        raise InvalidValueError("prefetch_to_device=True but no GPU is visible")
    return gpus[0].name if gpus else None


def check_not_forked() -> None:
    """TensorFlow's runtime does not survive a fork: a DataLoader worker forked from a
    process where it had started hangs on its first op. Refuse, saying what works
    (``reader.torch`` calls it in a DataLoader worker)."""
    from reader.compat.tf import runtime_started

    if runtime_started():  # before the fork
        raise OperationError(
            "TorchReader(backend='tf') in a DataLoader worker forked from a process that "
            "had already started TensorFlow (TensorFlow hangs after a fork): use "
            "DataLoader(..., num_workers=0), or multiprocessing_context='spawn', or "
            "backend='dali'"
        )
