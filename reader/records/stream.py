"""The worker's serialized records in read-plan order, as tf.data datasets.

``Stream`` reads the plan's runs of records, group by group (``reader/order/plan.py``):
each group's runs interleaved round-robin, the seeded window permutation on top,
epochs joined, a start anywhere. ``lead`` fetches the records a resized read
begins with. A bucket's shards are read from the local copies of a
``reader.cache.shard_cache.ShardCache``. No function of tf.data's runs per record:
a per-record map or filter cost 80% of the raw read rate.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from reader.compat import tf as compat_tf
from reader.front.share import Share
from reader.order.plan import ReadPlan, Resume, Runs
from reader.records import tfcall
from reader.records.record_offsets import Records
from reader.values.one_line import OWN_CHECK, own_message
from reader.values.read_options import ReadOptions
from reader.values.split_shards import open_shard
from schemas import storage, tfrecord
from schemas.info import DatasetError

tf = storage.tensorflow()

CHUNK = 1024  # records a vectorized step of the stream handles at once
FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"  # open descriptors


class Stream:
    """The worker's serialized records in :class:`ReadPlan` order; (record, epoch) pairs
    with augmentations (``o.augmenting``), which are seeded by the epoch."""

    def __init__(
        self, plan: ReadPlan, mine: list[dict], compression: str, o: ReadOptions, cache=None
    ):
        self.plan = plan
        self.shard_cache = cache  # a ShardCache: groups read local copies it fetched ahead
        self.tagged = o.augmenting
        self.paths = tf.constant([s["path"] for s in mine])
        self.counts = tf.constant([s["num_examples"] for s in mine], tf.int64)
        self.sizes = tf.constant([s["num_bytes"] for s in mine], tf.int64)
        self.compression = "GZIP" if compression == "gzip" else ""
        self.held = _Held()
        # read by place (``plan.by_place``): each epoch one permutation of the records
        self.by_place = Records(mine) if plan.by_place else None
        # cache: this worker's records in memory, read once now, in stored order.
        self.cached = None
        if o.cache:
            self.cached = tf.constant(
                [r for s in mine for r in tfrecord.iter_records(s["path"])], tf.string
            )

    def records(self, start: int, epochs: int | None):
        """Records from ``start`` (counted over all epochs) to the end of the last epoch."""
        plan = self.plan
        epoch, position = divmod(start, plan.size)
        end = (1 << 62) if epochs is None else epochs
        if epoch >= end:  # resumed at the very end
            return self._epoch(0, self._resume(0, 0)).take(0)
        records = self._epoch(epoch, self._resume(epoch, position), position, first=True)
        if epoch + 1 < end:
            rest = tf.data.Dataset.range(epoch + 1, end).flat_map(tfcall.graph(self._whole_epoch))
            records = records.concatenate(rest)
        # Reading runs in its own thread: with decoding on every core, a
        # read that waited for the consumer cost 15-30% of the decode rate.
        return records.prefetch(CHUNK)

    def _by_ids(self) -> bool:
        """Whether an epoch is read as its order of record ids (from memory, or fetched
        by place), not as runs: then no run is computed."""
        return self.cached is not None or self.by_place is not None

    def _resume(self, epoch: int, position: int) -> Resume | None:
        """Where the runs of ``epoch`` are opened for ``position`` (None: by ids)."""
        return None if self._by_ids() else self.plan.resume(epoch, position)

    def _whole_epoch(self, epoch):
        if self._by_ids():
            return self._epoch(epoch, None)
        runs = tfcall.call(
            lambda e: _columns(self.plan.runs(e)),
            [epoch],
            (tf.int64, tf.int64, tf.int64),
            stateful=False,
        )
        for part in runs:
            part.set_shape([self.plan.num_runs])
        return self._epoch(epoch, Resume(Runs(*runs), self.plan.offset, 0, 0))

    def _epoch(self, epoch, at: Resume | None, position: int = 0, first: bool = False):
        """One epoch's records from ``at`` (None: by ids, from ``position``); ``first``:
        the read's first epoch, whose first group starts a pass over the read (the
        bucket cache starts over there)."""
        # No function of tf.data's runs per record here: a per-record map or
        # filter cost 80% of the raw read rate.
        plan = self.plan
        epoch = tf.cast(epoch, tf.int64)
        if self.cached is not None:
            ids = tfcall.call(plan.epoch_order, [epoch], tf.int64, stateful=False)
            ids.set_shape([None])
            records = tf.data.Dataset.from_tensor_slices(ids[position:]).batch(CHUNK)
            tag = tfcall.graph(lambda i: self._tag(tf.gather(self.cached, i), epoch))
            return records.map(tag).unbatch()
        if self.by_place is not None:  # fetched by place, a chunk a Python call
            ids = tfcall.call(plan.epoch_order, [epoch], tf.int64, stateful=False)
            ids.set_shape([None])
            chunks = tf.data.Dataset.from_tensor_slices(ids[position:]).batch(CHUNK)
            return chunks.map(tfcall.graph(lambda i: self._tag(self._fetch(i), epoch))).unbatch()
        groups = tf.data.Dataset.from_tensor_slices(_columns(at.runs)).batch(plan.cycle)
        groups = groups.enumerate().map(
            tfcall.graph(lambda k, g: (*g, tf.logical_and(first, tf.equal(k, 0))))
        )
        records = groups.flat_map(tfcall.graph(self._group))
        if at.raw_skip:
            records = records.skip(at.raw_skip)
        if plan.stride > 1:
            records = records.shard(plan.stride, 0)
        if plan.windowed:

            def permute(window, batch):
                order = tfcall.call(
                    plan.window_permutation,
                    [epoch, window, tf.size(batch, out_type=tf.int64)],
                    tf.int64,
                    stateful=False,
                )
                # numpy_function's output has no rank: say it, or every later
                # element (and Keras, which needs ranks) has none either
                order.set_shape([None])
                return self._tag(tf.gather(batch, order), epoch)

            records = (
                records.batch(plan.window).enumerate(at.first_window).map(tfcall.graph(permute))
            )
            records = records.unbatch()
        elif self.tagged:
            tag = tfcall.graph(lambda b: self._tag(b, epoch))
            records = records.batch(CHUNK).map(tag).unbatch()
        return records.skip(at.tail_skip) if at.tail_skip else records

    def _fetch(self, ids):
        """The records of ``ids`` (the worker's), fetched by place and checked."""
        data = tfcall.call(self.by_place.many, [ids], tf.string, stateful=False)
        data.set_shape([None])
        return data

    def _tag(self, records, epoch):
        """A window or chunk of records, with its epoch when crops need it."""
        return (records, tf.fill(tf.shape(records), epoch)) if self.tagged else records

    def _group(self, files, starts, stops, first):
        """One group of runs, read round-robin ``block`` records at a time; ``first``:
        the first group of a pass over the read."""
        paths, sizes, counts = (tf.gather(t, files) for t in (self.paths, self.sizes, self.counts))
        if self.shard_cache is not None:  # the local copies, once the cache has them
            paths, shift, sizes, counts = tfcall.call(
                self._local,
                [files, starts, stops, first],
                (tf.string, tf.int64, tf.int64, tf.int64),
                stateful=True,
            )
            for part in (paths, shift, sizes, counts):
                part.set_shape(files.shape)
            starts, stops = starts - shift, stops - shift  # a run's copy holds it alone

        def read(path, size, listed, start, stop):
            # The shard is opened and checked as each run starts (one Python call a run,
            # not a record), and TensorFlow reads it through that descriptor: a shard
            # removed under the read stops it naming the shard, where TFRecordDataset
            # under ignore_errors retried a file it could not open forever.
            held, token = tfcall.call(
                self.held.open, [path, size], (tf.string, tf.int64), stateful=True
            )
            held.set_shape([])
            token.set_shape([])
            records = _checked_records(path, held, listed, self.compression, start, stop)
            return records.concatenate(self.held.closing(token))

        # A sequential interleave: a parallel one nested in flat_map is not
        # autotuned, and its threads cost 30% of the decode rate on 2 cores.
        runs = (paths, sizes, counts, starts, stops)
        return tf.data.Dataset.from_tensor_slices(runs).interleave(
            tfcall.graph(read), cycle_length=self.plan.cycle, block_length=self.plan.block
        )

    def _local(self, files, starts, stops, first):
        """The cache's local copies of a group's runs (``ShardCache.runs``), as arrays."""
        paths, *columns = self.shard_cache.runs(files, starts, stops, bool(first))
        return (np.array(paths, dtype=object), *(np.array(c, np.int64) for c in columns))


class _Held:
    """The shards a stream's runs read, each held open from its run's check to its
    run's end; TensorFlow opens ``/proc/self/fd/N``, so the file it reads is the one
    checked. A run left unfinished (a read stopped early) keeps its descriptor until
    ``LIMIT`` later runs have opened theirs: far more than the runs one iterator
    reads at once (the interleave's cycle)."""

    LIMIT = 256

    def __init__(self):
        self.fds: OrderedDict[int, int] = OrderedDict()  # token -> descriptor
        self.tokens = 0
        self.lock = threading.Lock()

    def open(self, path: bytes, listed) -> tuple[bytes, np.int64]:
        fd = open_shard(path.decode(), int(listed))
        with self.lock:
            self.tokens += 1
            self.fds[self.tokens] = fd
            while len(self.fds) > self.LIMIT:
                os.close(self.fds.popitem(last=False)[1])
            return f"{FD_DIR}/{fd}".encode(), np.int64(self.tokens)

    def close(self, token) -> bytes:
        with self.lock:
            fd = self.fds.pop(int(token), None)
        if fd is not None:
            os.close(fd)
        return b""

    def closing(self, token):
        """An empty dataset that closes the run's descriptor when it is reached."""

        def close(t):
            done = tfcall.call(self.close, [t], tf.string, stateful=True)
            done.set_shape([])  # a record's shape, for the runs it ends
            return done

        done = tf.data.Dataset.from_tensors(token).map(tfcall.graph(close))
        return done.filter(tfcall.graph(lambda _: False))

    def __del__(self):
        for fd in self.fds.values():
            os.close(fd)


def _columns(runs: Runs) -> tuple:
    return runs.file, runs.start, runs.stop


def _checked_records(path, held, listed, compression, start, stop):
    """Records ``start`` to ``stop`` of one shard ``path``, read from ``held`` (``listed``
    records in dataset_info.json); a corrupt or short shard raises an error naming it.

    TensorFlow's own DataLossError does not say which file failed. Here a read
    error ends the file (``ignore_errors``), and a sentinel that raises an
    error naming the shard follows its records; ``take(stop)`` stops before
    the sentinel when the shard holds the records dataset_info.json lists,
    and reaches it only when the shard came up short. All of it runs in
    tf.data's C++ ops: no Python function per record (a per-record check cost
    90% of the read rate, a per-chunk one 40%). ``skip`` hops over record
    headers without checking or copying the skipped records.
    """
    records = tf.data.TFRecordDataset(
        held, compression_type=compression, buffer_size=1 << 20
    ).ignore_errors()

    def failing(found: str):
        """A map that fails on any element, its message the shard, what it ``found``
        and ``listed`` in one string (``reader.one_line`` reads it back whole)."""
        message = tf.strings.join(
            [
                path,
                f" {found} ",
                tf.strings.as_string(listed),
                " listed in dataset_info.json (convert again, or restore it)",
            ]
        )

        def fail(_):
            check = tf.debugging.Assert(tf.constant(False), [OWN_CHECK, message])
            with tf.control_dependencies([check]):
                return tf.constant(b"")

        return tfcall.graph(fail)

    short = failing("is corrupt (CRC mismatch or truncated): it holds fewer good records than the")
    sentinel = tf.data.Dataset.from_tensors(path).map(short)
    records_read = records.concatenate(sentinel).take(stop).skip(start)
    if not compression:
        return records_read  # the shard's DALI index was checked to hold `listed` records
    # A gzip shard has no index to count by: the run that ends the file looks one
    # record further (a second decompression of the file, gzip shards only).
    last = tf.cast(tf.equal(stop, listed), tf.int64)
    more = records.skip(listed).take(last).map(failing("holds more records than the"))
    return records_read.concatenate(more)


def named(dataset):
    """``dataset``, whose Python iteration raises a shard's own error (corrupt, or more
    records than listed: ``_checked_records``) as a :class:`DatasetError`, its message
    alone, instead of TensorFlow's text around it."""

    def translate(error: Exception) -> DatasetError | None:
        message = own_message(error)
        return None if message is None else DatasetError(message)

    return compat_tf.errors_as(dataset, translate)


def lead(share: Share, tagged: bool):
    """The worker's lead (records the workers of a resumed run left; docs/design.md,
    "Elastic resume"): fetched by offset in chunks, one Python call a chunk."""
    records = Records(share.split)
    ids, epochs = share.lead

    def fetch(chunk, epoch):
        data = tfcall.call(records.many, [chunk], tf.string, stateful=False)
        data.set_shape([None])
        return (data, epoch) if tagged else data

    chunks = tf.data.Dataset.from_tensor_slices((ids, epochs)).batch(CHUNK)
    return chunks.map(tfcall.graph(fetch)).unbatch()
