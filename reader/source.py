"""The worker's records in read-plan order, fetched by offset, without TensorFlow.

The DALI pipeline and the PyTorch iterable read through here: the same
:class:`reader.worker.WorkerRead` as ``make_dataset`` (files, counts, order,
batches across epoch boundaries, padding, ``start_step``), with records
fetched by their offsets in the DALI index convert writes beside each
uncompressed shard, so any position is one ``pread`` away.

A bucket's shards are read from the local copies of a ``reader.cache.ShardCache``,
which fetches them ahead group by group: there each window of the order is read
as its groups give it (group after group, as the cache has them), then permuted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import numpy as np

from reader.cache import check_limit, open_cache
from reader.info import check_shard, default_path_root
from reader.mixture import MixRead, Mixture
from reader.options import ReadOptions
from reader.worker import WorkerRead
from schemas import features, layout, storage, tfrecord
from schemas.example import parse_example
from schemas.info import DatasetError, load_info


@dataclasses.dataclass
class Batch:
    """One batch: encoded images and their records' fields, in read order.

    ``mask`` is False on padding rows (``pad_final_batch``), whose encoded
    image repeats a real one so that decoders see a valid image; their
    label is 0 and key empty, as in ``make_dataset``.
    """

    encoded: list[np.ndarray]
    label: np.ndarray
    key: list[str]
    mask: np.ndarray


class Records:
    """Records of some shards fetched by their DALI index: ``get(i)`` is record ``i``
    counting over the shards in order (each shard checked: length and CRCs)."""

    def __init__(self, shards: list[dict]):
        self._paths = [s["path"] for s in shards]
        self._tables = [s["table"] for s in shards]
        self._sizes = [s["num_bytes"] for s in shards]
        counts = [s["num_examples"] for s in shards]
        self._firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self._fds: dict[int, int] = {}  # shard -> an open descriptor, opened on first use
        self._local: dict[int, str] = {}  # shard -> the cache's local copy (see ``use``)

    def __enter__(self) -> Records:
        return self

    def __exit__(self, *_) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def get(self, i: int) -> bytes:
        return self._get(i, self._fds)

    def use(self, local: dict[int, str]) -> None:
        """Reads these shards (by index) from these local copies, and closes the
        descriptors of every other shard (an evicted copy must not stay open)."""
        for f in [f for f in self._fds if f not in local]:
            os.close(self._fds.pop(f))
        self._local = local

    def _get(self, i: int, fds: dict[int, int]) -> bytes:
        f = int(np.searchsorted(self._firsts, i, side="right")) - 1
        r = i - int(self._firsts[f])
        offset, size = (int(v) for v in self._tables[f][r])
        path = self._local.get(f, self._paths[f])
        if storage.is_url(path):  # a lead from a bucket: one ranged request
            framed = storage.read_range(path, size, offset)
        else:
            if f not in fds:
                check_shard(path, self._sizes[f])  # removed or replaced since the build?
                fds[f] = os.open(path, os.O_RDONLY)
            framed = os.pread(fds[f], size, offset)
        try:
            return tfrecord.unframe(framed, path, r, offset)
        except tfrecord.CorruptRecord as e:
            raise DatasetError(f"{e}: the shard is corrupt or truncated") from None

    def many(self, ids) -> np.ndarray:
        """The records of ``ids``, as an object array of bytes (a chunk for tf.data).
        Safe from several threads at once (tf.data runs chunks in parallel): each call
        opens and closes its own descriptors."""
        fds: dict[int, int] = {}
        try:
            return np.array([self._get(int(i), fds) for i in ids], dtype=object)
        finally:
            for fd in fds.values():
                os.close(fd)


class _Part:
    """One source's examples in its read order (its lead, then its own order)."""

    def __init__(self, data_dir: str, info: dict, read: WorkerRead, options: ReadOptions):
        if info["compression"] != "none":
            raise DatasetError(
                f"{data_dir} has {info['compression']} shards: this reader fetches records "
                "by offset from the DALI index, which only uncompressed shards have; "
                "convert without --compression"
            )
        self.read, self.options = read, options
        self.kind = info["record_kind"]
        self.root = default_path_root(info, options.path_root)
        self.own = Records(read.shards)
        self.split = Records(read.split) if read.split else None
        if storage.is_url(read.shards[0]["path"]):
            check_limit(read.shards, read.plan.cycle, options.cache_limit)  # said now

    def examples(self):
        # The cache (and its fetching thread) starts in the process that reads: a
        # DataLoader worker forked after this source was made, say.
        cache = open_cache(self.read, self.options)
        with self.own, self.split or contextlib.nullcontext(), cache or contextlib.nullcontext():
            if self.read.lead is not None:
                for i in self.read.lead[0]:
                    yield self.example(self.split.get(int(i)))
            plan, epochs = self.read.plan, self.options.epochs
            epoch, position = divmod(self.read.start, plan.size)
            opened = True  # the read's first epoch: opened where ``position`` is
            while epochs is None or epoch < epochs:
                if cache is None:
                    for i in plan.epoch_order(epoch)[position:]:
                        yield self.example(self.own.get(int(i)))
                else:
                    for data in self._cached_epoch(cache, epoch, position, opened):
                        yield self.example(data)
                epoch, position, opened = epoch + 1, 0, False

    def _cached_epoch(self, cache, epoch: int, position: int, opened: bool):
        """An epoch's records from ``position`` on, each window read as its groups give
        it, entering the groups in the order the cache fetches them (``ReadPlan.groups``:
        the read's first epoch from the group that holds its first record, every group
        of the later ones, those that give this worker nothing too)."""
        plan = self.read.plan
        ids, group = plan.raw_order(epoch)
        files = plan.runs(epoch).file
        step = plan.window if plan.windowed else 1024
        first = position - position % step
        entered = int(group[first]) - 1 if opened else -1

        def enter_through(g: int) -> None:
            nonlocal entered
            while entered < g:
                entered += 1
                shards = files[entered * plan.cycle : (entered + 1) * plan.cycle]
                self.own.use(dict(zip((int(f) for f in shards), cache.enter(shards))))

        for w, start in enumerate(range(first, len(ids), step), start=first // step):
            stop = min(start + step, len(ids))
            window = []
            for k in range(start, stop):
                enter_through(int(group[k]))
                window.append(self.own.get(int(ids[k])))
            if plan.windowed:
                window = [window[j] for j in plan.window_permutation(epoch, w, len(window))]
            yield from window[position - start if start == first else 0 :]
        enter_through(-(-plan.num_runs // plan.cycle) - 1)  # groups that give nothing

    def example(self, data: bytes) -> tuple:
        """(encoded image, label, key) of a serialized record."""
        ex = parse_example(data)
        if self.kind == "image":
            encoded = ex[features.ENCODED]
        else:
            encoded = storage.read_bytes(layout.join(self.root, ex[features.PATH].decode()))
        return (
            np.frombuffer(eight_bit_png(encoded), np.uint8),
            ex[features.LABEL],
            ex[features.KEY].decode(),
        )

    def filler(self) -> tuple:
        """An example to stand in the padding rows (masked): the first of the worker's
        first shard (from the bucket, a ranged read)."""
        with Records(self.read.shards[:1]) as first:
            return self.example(first.get(0))


class RecordSource:
    """Batches of one worker's share of a split, or of a mixture (see the module docstring).

    Args:
        data_dir, split, batch_size, options: as for ``reader.make_dataset``
            (``image_size`` and the like are the decoder's business);
            ``data_dir`` may be a ``reader.mix`` mixture.
        state: a :class:`reader.ReadState` to resume (any worker count).

    Raises:
        DatasetError: as ``make_dataset``; also for gzip-compressed shards
            (no index: convert without ``--compression gzip``).
        ValueError: for a bucket, a ``cache_limit`` below what a group of runs reads
            at once (``reader.cache.open_cache``).
    """

    def __init__(self, data_dir, split: str, batch_size: int, options: ReadOptions, state=None):
        self.options, self.batch_size = options, batch_size
        if isinstance(data_dir, Mixture):
            self.read = MixRead.of(data_dir, batch_size, options, state)
            self._parts = [_Part(d, info, w, options) for info, d, _, w in self.read.parts]
            self.infos = [info for info, *_ in self.read.parts]
        else:
            info = load_info(data_dir)
            self.read = WorkerRead.of(info, data_dir, split, batch_size, options, state)
            self._parts = [_Part(data_dir, info, self.read, options)]
            self.infos = [info]

    def __len__(self) -> int:
        if self.read.remaining is None:
            raise TypeError("an endless read (epochs=None) has no length")
        return self.read.remaining

    def __iter__(self):
        """Batches from the read's start on, as ``make_dataset`` yields them."""
        o, size = self.options, self.batch_size
        left = self.read.remaining
        if left == 0:
            return
        pending: list[tuple] = []
        for example in self._stream():
            pending.append(example)
            if len(pending) == size:
                yield self._batch(pending, size)
                pending, left = [], None if left is None else left - 1
                if left == 0:
                    return
        if pending and not o.drop_remainder:
            yield self._batch(pending, size if o.pad_final_batch else len(pending))
            left -= 1
        while o.pad_final_batch and left > 0:  # all-padding batches, as every worker
            yield self._batch([], size, like=self._parts[0].filler())
            left -= 1

    def _stream(self):
        """The worker's examples in read order; a mixture's by its schedule."""
        streams = [part.examples() for part in self._parts]
        if not isinstance(self.read, MixRead):
            yield from streams[0]
            return
        schedule, at = self.read.schedule, self.read.start
        while True:
            chunk = schedule.choices(at, at + 1024)
            if not len(chunk):
                return
            for i in chunk:
                yield next(streams[i])
            at += len(chunk)

    @staticmethod
    def _batch(rows: list[tuple], size: int, like: tuple | None = None) -> Batch:
        real = len(rows)
        filler = rows[0] if rows else like
        rows = rows + [(filler[0], 0, "")] * (size - real)
        return Batch(
            encoded=[r[0] for r in rows],
            label=np.array([r[1] for r in rows], np.int64),
            key=[r[2] for r in rows],
            mask=np.arange(size) < real,
        )


def eight_bit_png(encoded: bytes) -> bytes:
    """A 16-bit PNG as the 8-bit PNG of its samples' high bytes; any other image as is.

    The readers' rule for 16-bit samples is libpng's strip, the high byte
    (TensorFlow); DALI rounds instead (off by 1 on a quarter of the samples),
    and asking DALI for 16-bit output halved its decode rate for every image.
    16-bit PNGs are rare: they alone are rewritten here, with Pillow and numpy.
    """
    if encoded[:8] != b"\x89PNG\r\n\x1a\n" or len(encoded) < 26 or encoded[24] != 16:
        return encoded
    import io

    from PIL import Image

    color_type = encoded[25]
    with Image.open(io.BytesIO(encoded)) as im:
        im.load()
        if color_type == 0:  # gray: Pillow keeps 16 bits (I;16)
            out = Image.fromarray((np.asarray(im, np.uint16) >> 8).astype(np.uint8), "L")
        elif color_type == 4:  # gray+alpha: Pillow gives RGBA of the high bytes
            rgba = np.asarray(im.convert("RGBA"))
            out = Image.fromarray(np.ascontiguousarray(rgba[..., [0, 3]]), "LA")
        else:  # RGB, RGBA: Pillow unpacks the high bytes
            out = im.copy()
    buffer = io.BytesIO()
    out.save(buffer, "PNG", compress_level=0)
    return buffer.getvalue()
