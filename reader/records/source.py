"""Batches of a worker's examples in read order, without TensorFlow.

The DALI pipeline and the PyTorch iterable read through here: the same
:class:`reader.front.read.Read` as ``make_dataset`` (files, counts, order,
batches across epoch boundaries, padding, ``start_step``, mixing), its records
fetched by offset (``reader.records.record_offsets``) and parsed in Python
(``reader.decode.pydecode``).

A bucket's shards are read from the local copies of a ``reader.cache.shard_cache.ShardCache``,
which fetches them ahead group by group: there each window of the order is read
as its groups give it (group after group, as the cache has them), then permuted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json

import numpy as np

from reader.cache.policy import check_limit
from reader.cache.shard_cache import open_cache
from reader.decode.pydecode import parse
from reader.examples import load_spec
from reader.front.read import resolve
from reader.order.batches import skipped
from reader.records.example_batches import RecordFields
from reader.records.record_offsets import Records
from reader.values.one_line import one_line
from reader.values.read_options import ReadOptions
from reader.values.split_shards import default_path_root
from schemas import features, storage
from schemas.errors import InvalidTypeError, InvalidValueError
from schemas.example import parse_example
from schemas.info import DatasetError


@dataclasses.dataclass
class Batch:
    """One batch: encoded images and their records' fields and epochs, in read order.

    ``mask`` is False on padding rows (``pad_final_batch``), whose encoded
    image repeats a real one so that decoders see a valid image; their
    label is 0 and key empty, as in ``make_dataset``. A placed row
    (``RecordSource(placed=True)``) holds (its record's place, kind, root) instead of
    its image, label 0 and key "" until a worker fetches it.
    """

    encoded: list  # of np.ndarray, or (Place, kind, root) where placed
    label: np.ndarray
    key: list[str]
    mask: np.ndarray
    epoch: np.ndarray  # of each row (its augmentations are seeded by it); 0 on padding
    step: int = -1  # the read's step of the batch (-1: padding alone)
    fetches: list | None = None  # each row's fetch (``RecordSource.skip``), None on padding
    failed: list | None = None  # (row, fetch, reason) of rows that failed to parse, when
    # the ledger is written as the batch is taken (``RecordSource.deferred``)


class _Part:
    """One source's examples in its read order (its lead, then its own order)."""

    def __init__(self, source, options: ReadOptions, placed: bool = False):
        if source.info.compression != "none":
            raise DatasetError(
                f"{source.data_dir} has {source.info.compression} shards: this reader "
                "fetches records by offset from the DALI index, which only uncompressed "
                "shards have; convert without --compression"
            )
        self.share, self.options = source.share, options
        self.kind = source.info.record_kind
        self.root = default_path_root(source.info, options.path_root)
        # a local image record's place, not its bytes (``fetch``); a record that is no
        # image is parsed where it is read (``example_batches.python_batch``)
        self.placed = placed and self.kind != "example"
        self.fields = None  # records that are not images: their label and key features
        if source.info.record_kind == "example":
            self.fields = RecordFields.of(source.info, load_spec(source.data_dir))
        self.own = Records(self.share.shards)
        self.split = Records(self.share.split) if self.share.split else None
        if storage.is_url(self.share.shards[0]["path"]):
            check_limit(self.share.shards, self.share.plan.cycle, options.cache_limit)  # said now

    def examples(self):
        """The examples in read order, each as a call that fetches and parses it: the
        caller calls it at once or never (a record it skips is not read, or, from the
        bucket cache, which fetches whole windows, not parsed)."""
        # The cache (and its fetching thread) starts in the process that reads: a
        # DataLoader worker forked after this source was made, say.
        cache = open_cache(self.share, self.options)
        with self.own, self.split or contextlib.nullcontext(), cache or contextlib.nullcontext():
            if self.share.lead is not None:
                for i, e in zip(*self.share.lead):
                    yield functools.partial(self.fetch, self.split, int(i), int(e))
            plan, epochs = self.share.plan, self.options.epochs
            epoch, position = divmod(self.share.start, plan.size)
            opened = True  # the read's first epoch: opened where ``position`` is
            while epochs is None or epoch < epochs:
                if cache is None:
                    for i in plan.epoch_order(epoch)[position:]:
                        yield functools.partial(self.fetch, self.own, int(i), epoch)
                else:
                    for data in self._cached_epoch(cache, epoch, position, opened):
                        yield functools.partial(self.example, data, epoch)
                epoch, position, opened = epoch + 1, 0, False

    def _cached_epoch(self, cache, epoch: int, position: int, opened: bool):
        """An epoch's records from ``position`` on, each window read as its groups give
        it, entering the groups in the order the cache fetches them (``ReadPlan.groups``:
        the read's first epoch from the group that holds its first record, every group
        of the later ones, those that give this worker nothing too)."""
        plan = self.share.plan
        ids, group = plan.raw_order(epoch)
        step = plan.window if plan.windowed else 1024
        first = position - position % step if plan.windowed else position
        # the runs the cache fetches: the opened group's moved past what they gave
        runs = plan.resume(epoch, position).runs if opened else plan.runs(epoch)
        entered = int(group[first]) - 1 if opened else -1
        before = entered + 1  # groups before the first of ``runs``

        def enter_through(g: int) -> None:
            nonlocal entered
            while entered < g:
                entered += 1
                part = slice((entered - before) * plan.cycle, (entered + 1 - before) * plan.cycle)
                columns = (runs.file[part], runs.start[part], runs.stop[part])
                paths, shift, _, count = cache.runs(*columns)
                self.own.use(zip(runs.file[part], shift, np.add(shift, count), paths))

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

    def fetch(self, records: Records, i: int, epoch: int) -> tuple:
        """Record ``i`` of ``records``, read in ``epoch``, as ``example`` gives it; when
        ``placed``, a local record as ((its place, kind, root), 0, "", epoch): a worker
        fetches and parses it (``reader.routes.preprocess_worker``), its label and key unknown
        here."""
        if self.placed:
            place = records.place(i)
            if not storage.is_url(place.path):
                return (place, self.kind, self.root), 0, "", epoch
        return self.example(records.get(i), epoch)

    def example(self, data: bytes, epoch: int = 0) -> tuple:
        """(encoded image, label, key, epoch) of a serialized record read in ``epoch``."""
        return (*parse(data, self.kind, self.root, self.fields), epoch)

    def filler(self) -> tuple:
        """An example to stand in the padding rows (masked): the first of the worker's
        first shard (from the bucket, a ranged read); with ``on_error="skip"``, the first
        of its shards that can be read (a damaged record's own row is masked where it
        is met, and it must not stand in for the padding too)."""
        shards = self.share.shards
        with Records(shards) as records:
            for i in range(sum(s["num_examples"] for s in shards)):
                try:
                    return self.example(records.get(i))
                except Exception:  # noqa: BLE001 - damage shows as any parse error
                    if self.options.on_error != "skip":
                        raise
        raise DatasetError(f"no record of {shards[0]['path']} and the rest can be read")


def _unchecked(path: str, offset: int, size: int) -> bytes:
    """A local record's data, its CRCs unchecked (to name the key of a damaged one)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)[12:-4]


class RecordSource:
    """Batches of one worker's share of a split, or of a mixture (see the module docstring).

    Args:
        data_dir, split, batch_size, options: as for ``reader.make_dataset``
            (``image_size`` and the like are the decoder's business);
            ``data_dir`` may be a ``reader.mix`` mixture.
        state: a :class:`reader.ReadState` to resume (any worker count).
        placed: a batch holds its local records' places, not their bytes
            (``_Part.fetch``): for the Python route, whose workers fetch them.

    Raises:
        DatasetError: as ``make_dataset``; also for gzip-compressed shards
            (no index: convert without ``--compression gzip``).
        ValueError: for a bucket, a ``cache_limit`` below what a group of runs reads
            at once (``reader.cache.shard_cache.open_cache``).
    """

    def __init__(
        self,
        data_dir,
        split: str,
        batch_size: int,
        options: ReadOptions,
        state=None,
        placed: bool = False,
    ):
        self.read = resolve(data_dir, split, batch_size, options, state)
        self.options, self.batch_size = self.read.options, batch_size
        self.made_with = (data_dir, split, batch_size, options)  # a resume makes it again
        # a local record's place in its batch, not its bytes (``_Part.fetch``): not
        # where rows are kept by their keys (the state's excluded ones)
        placed = placed and not self.read.excluded
        self._parts = [_Part(source, self.options, placed) for source in self.read.sources]
        self.infos = [source.info for source in self.read.sources]
        self.every, self.first = 1, 0  # the batches yielded (``deal``)
        self.errors = 0  # records skipped (``on_error="skip"``)
        # the rows that fail to parse go with their batch (``Batch.failed``), written to
        # the ledger as it is taken, after its decode: the same order for any processes
        self.deferred = False
        self._failed: list[tuple] = []  # the batch being filled's

    def deal(self, every: int, first: int) -> None:
        """Yield only batches ``first``, ``first + every``, ... of the read (counted
        from its start): one DataLoader worker's of ``every``. The records of the
        others are skipped unread (from the bucket cache, unparsed), their batches
        never made, so nothing decodes them."""
        if not 0 <= first < every:
            raise InvalidValueError(
                f"deal(every, first) needs 0 <= first < every, got {every}, {first}"
            )
        self.every, self.first = every, first

    def __len__(self) -> int:
        """The batches iteration yields (this worker's of ``deal``)."""
        if self.read.yields is None:
            raise InvalidTypeError("an endless read (epochs=None) has no length")
        return len(range(self.first, self.read.yields, self.every))

    def __iter__(self):
        """Batches from the read's start on, as ``make_dataset`` yields them (those
        ``deal`` gives this worker; the state's skipped steps left out, unread)."""
        o, size = self.options, self.batch_size
        left = self.read.remaining
        if left == 0:
            return
        index, rows = 0, 0  # the batch being filled, and its rows so far
        dealt = 0  # batches of the read yielded before it (by this worker or another)
        pending: list[tuple] = []  # its examples, when it is kept
        fetches: list = []  # and their fetches (a row skipped at decode is named by its)
        keep = self._kept(index, dealt)
        for fetch in self._stream():
            if keep:  # called now, before the stream moves on
                pending.append(self._fetched(fetch, index, len(pending)))
                fetches.append(fetch)
            rows += 1
            if rows == size:
                if keep:
                    yield self._batch(pending, size, self._step(index), fetches)
                dealt += not skipped(index, self.read.skips)
                pending, fetches, rows, index = [], [], 0, index + 1
                left = None if left is None else left - 1
                if left == 0:
                    return
                keep = self._kept(index, dealt)
        if rows and not o.drop_remainder:
            if keep:
                yield self._batch(
                    pending, size if o.pad_final_batch else rows, self._step(index), fetches
                )
            index, left = index + 1, left - 1
        while o.pad_final_batch and left > 0:  # all-padding batches, as every worker
            if index % self.every == self.first:
                yield self.padding()
            index, left = index + 1, left - 1

    def _fetched(self, fetch, index: int, row: int) -> tuple | None:
        """The example ``fetch`` gives; with ``on_error="skip"``, None for one that
        cannot be read (written to the ledger, now or with its batch), until more
        than ``max_errors``."""
        try:
            return fetch()
        except Exception as e:  # noqa: BLE001 - damage shows as any parse error
            if self.options.on_error != "skip":
                raise
            if self.deferred:
                self._failed.append((row, fetch, one_line(e)))
            else:
                self.skip(fetch, self._step(index), one_line(e))
            return None

    def _step(self, index: int) -> int:
        """The step of the read's batch ``index`` (counted from the state's)."""
        return index + (self.read.state.step if self.read.state is not None else 0)

    def skip(self, fetch, step: int, reason: str, key: str | None = None) -> None:
        """Writes to the ledger the record ``fetch`` (a row's of ``Batch.fetches``; None:
        its place unknown) gives, left out of step ``step`` (it failed to parse, or
        ``key``'s image to decode: ``reason``), and stops the read once more than
        ``max_errors`` were."""
        o = self.options
        shard, offset, epoch, data = "", -1, -1, None
        if fetch is not None and len(fetch.args) == 3:  # by offset: (records, i, epoch)
            records, i, epoch = fetch.args
            shard, offset, size = records.where(i)
            data = functools.partial(_unchecked, shard, offset, size)
        elif fetch is not None:  # from the bucket cache: (serialized record, epoch)
            serial, epoch = fetch.args
            data = functools.partial(bytes, serial)
        if key is None:
            try:
                key = parse_example(data())[features.KEY].decode()
            except Exception:  # noqa: BLE001 - a record too damaged to name: its place does
                key = ""
        line = dict(key=key, shard=shard, offset=offset, epoch=epoch, step=step)
        line["reason"] = reason
        with open(o.error_ledger, "a") as ledger:
            ledger.write(json.dumps(line) + "\n")
        self.errors += 1
        if self.errors > o.max_errors:
            raise DatasetError(
                f"{self.errors} records could not be read (max_errors={o.max_errors}), "
                f"the last {shard} at byte {offset}: {line['reason']}; each is in "
                f"{o.error_ledger}: repair or convert the shards again, or raise max_errors"
            ) from None

    def _kept(self, index: int, dealt: int) -> bool:
        """Whether batch ``index`` of the read is made here: not skipped, and this
        worker's of ``deal``."""
        return not skipped(index, self.read.skips) and dealt % self.every == self.first

    def padding(self) -> Batch:
        """A batch of padding rows only (the first record of the worker's first shard,
        masked): what a read pads with."""
        return self._batch([], self.batch_size)

    def _stream(self):
        """The worker's examples in read order, as calls (``_Part.examples``); a
        mixture's by its schedule."""
        streams = [part.examples() for part in self._parts]
        if self.read.schedule is None:
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

    def _batch(self, rows: list[tuple], size: int, step: int = -1, fetches=None) -> Batch:
        """``rows`` padded to ``size``; rows of the state's excluded keys are padding
        rows too (their image never given: the filler is a kept row's, else the first
        record of the worker's first shard)."""
        kept = [r is not None and r[2] not in self.read.excluded for r in rows]
        filler = next((r for r, k in zip(rows, kept) if k), None)
        filler = filler or self._parts[0].filler()
        pad = (filler[0], 0, "", 0)
        rows = [r if k else pad for r, k in zip(rows, kept)] + [pad] * (size - len(rows))
        return Batch(
            encoded=[r[0] for r in rows],
            label=np.array([r[1] for r in rows], np.int64),
            key=[r[2] for r in rows],
            mask=np.array(kept + [False] * (size - len(kept)), bool),
            epoch=np.array([r[3] for r in rows], np.int64),
            step=step,
            fetches=fetches,
            failed=self._take_failed(),
        )

    def _take_failed(self) -> list:
        failed, self._failed = self._failed, []
        return failed
