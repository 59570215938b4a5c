"""One worker's share of one split: its shards, its read order and where it stands.

A :class:`Share` is what every face reads of a source: the tf.data pipeline
(``reader.pipeline``), the Python record source behind DALI and PyTorch
(``reader.records.source``) and the bucket cache. Its order comes from the order floor
(``reader.order``), given the split's example counts and a few integers. No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging

from reader.order.batches import remaining
from reader.order.deal import deal, worker_plan
from reader.order.elastic import Position, Segment
from reader.order.plan import ReadPlan
from reader.values.read_options import DEFAULT_CYCLE, ReadOptions
from reader.values.split_shards import load_index
from schemas import storage
from schemas.errors import InvalidValueError
from schemas.info import DatasetError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Share:
    """One worker's read of a split (see :meth:`of`).

    The worker's stream is its **lead** (records left by the workers of a run it
    resumes with another worker count; docs/design.md, "Elastic resume"), then its
    own order from ``start`` on.

    Attributes:
        shards: the worker's files, [{path, num_examples, num_bytes, index, table}]
            (``table``: the checked DALI index, [[offset, size]]; None for gzip).
        num_examples: examples the worker reads an epoch.
        shuffle, seed: whether it shuffles, and the seed.
        plan: the read order.
        lead: (split-wide record ids, their epochs) of the lead not yet read; None:
            no lead. ``split``: every shard of the split, with its table, to fetch
            them (None without a lead).
        start: the first record of its own order read, counted over all epochs.
        remaining: elements yielded from here on (batches, or examples without a
            batch size); None: endless.
        real_batches: with ``pad_final_batch``, batches holding real examples.
        segment: where the workers of this read stand (the state's new fields).
        lefts: records every worker of this read has left (None: endless).
    """

    shards: list[dict]
    num_examples: int
    shuffle: bool
    seed: int | None
    plan: ReadPlan
    lead: tuple | None
    split: list[dict] | None
    start: int
    remaining: int | None
    real_batches: int
    segment: Segment
    lefts: tuple | None = None

    @classmethod
    def of(
        cls,
        data_dir: str,
        split: str,
        shards: list[dict],
        batch_size: int | None,
        options: ReadOptions,
        seed: int | None,
        saved=None,
    ) -> Share:
        """Deals the split's ``shards`` (``reader.values.split_shards.split_shards``:
        checked); plans the order from the start the options give, or (``saved``: a
        ``ReadState``) resumes it with any worker count."""
        if not shards:
            raise DatasetError(f"split {split!r} of {data_dir} has no examples")
        shuffle = options.shuffles(split)
        n_workers, index = options.workers()
        _warn_uneven(split, len(shards), n_workers)
        counts = [s["num_examples"] for s in shards]
        order_seed = seed if shuffle else None
        cycle = options.cycle_length or DEFAULT_CYCLE
        whole = random_access(shards, options.random_access)
        if whole and shuffle:
            _warn_unshaped(options)
        plans = {}

        def plan_of(workers: int, w: int) -> ReadPlan:
            if (workers, w) not in plans:
                plans[workers, w] = worker_plan(
                    counts,
                    workers,
                    w,
                    order_seed,
                    cycle,
                    options.block_length,
                    options.shuffle_buffer,
                    whole,
                )
            return plans[workers, w]

        unit = batch_size or 1
        if saved is None:
            segment = Segment.plain(options.start_epoch, options.start_step * unit, n_workers)
        else:
            at = Position(
                saved.num_workers or n_workers, saved.epoch, saved.step * saved.batch_size
            )
            segment = Segment.resumed(
                at, saved.elastic, n_workers, counts, plan_of, options.epochs, unit
            )
        files, num_examples, _ = deal(counts, n_workers, index)
        # the count read is the count listed: each shard's index describes it exactly
        mine = [{**shards[f], "table": load_index(shards[f])} for f in files]
        lead = segment.lead(index)
        table = None
        if lead is not None and len(lead[0]):
            table = [{**s, "table": load_index(s)} for s in shards]
            if any(s["table"] is None for s in table):
                raise DatasetError(
                    f"{data_dir} has gzip shards: resuming with another worker count fetches "
                    "records by the DALI index, which only uncompressed shards have; convert "
                    "without --compression (or resume with the saved worker count)"
                )
        sizes = [plan_of(n_workers, w).size for w in range(n_workers)]
        left = [segment.left(w, sizes[w], options.epochs) for w in range(n_workers)]
        most = None if options.epochs is None else max(left)
        try:
            elements, real = remaining(
                left[index], most, batch_size, options.pad_final_batch, options.drop_remainder
            )
        except ValueError:
            raise InvalidValueError(
                f"start_epoch {options.start_epoch}, start_step {options.start_step} is past "
                f"the end of this read ({options.epochs} epochs on this worker)"
            ) from None
        if lead is not None:
            skip = segment.skipped(index)
            lead = (lead[0][skip:], lead[1][skip:])
        return cls(
            mine,
            num_examples,
            shuffle,
            seed,
            plan_of(n_workers, index),
            lead,
            table,
            segment.start(index, sizes[index]),
            elements,
            real,
            segment,
            None if options.epochs is None else tuple(left),
        )

    def skip(self, k: int) -> Share:
        """The same read ``k`` records further on (a read of single examples, unpadded:
        a source of a mixture, ``reader.mix``)."""
        lead, start = self.lead, self.start
        if lead is not None:
            given = min(k, len(lead[0]))
            lead, start = (lead[0][given:], lead[1][given:]), start + k - given
        else:
            start += k
        left = None if self.remaining is None else self.remaining - k
        return dataclasses.replace(self, lead=lead, start=start, remaining=left)

    @property
    def has_lead(self) -> bool:
        return self.lead is not None and len(self.lead[0]) > 0


_SAID_UNSHAPED: set = set()  # the options already warned of, once a process


def _warn_unshaped(options: ReadOptions) -> None:
    """One warning a process when the runs' and windows' options were set for a read by
    place, which they do not shape (a tf.data user tuning the buffer heard nothing)."""
    default = ReadOptions()
    set_ = tuple(
        name
        for name in ("shuffle_buffer", "cycle_length", "block_length")
        if getattr(options, name) != getattr(default, name)
    )
    if set_ and set_ not in _SAID_UNSHAPED:
        _SAID_UNSHAPED.add(set_)
        log.warning(
            "%s shape the runs and windows of a bucket's (or random_access=False) read "
            "only: these local shards are read by place, one permutation an epoch, "
            "which they do not change; pass random_access=False to read in windows",
            ", ".join(set_),
        )


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


def random_access(shards: list[dict], asked: bool | None) -> bool:
    """Whether a shuffled epoch is one permutation of the records, fetched by place
    (``ReadOptions.random_access``): where every record is one pread away (local shards
    with an index), unless ``asked`` is False; ``asked`` True where it is not, an error."""
    if asked is False:
        return False
    why = next(
        (
            f"{s['path']} is in a bucket (read in runs through the bounded cache)"
            if storage.is_url(s["path"])
            else f"{s['path']} is gzip-compressed (no index of offsets)"
            for s in shards
            if storage.is_url(s["path"]) or s["index"] is None
        ),
        None,
    )
    if why is not None and asked:
        raise InvalidValueError(
            f"random_access=True fetches each record by its offset, but {why}: pass "
            "random_access=None (runs and windows there) or read a local, uncompressed copy"
        )
    return why is None
