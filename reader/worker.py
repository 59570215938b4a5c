"""What one worker reads of a split, and in which order: shared by every reader.

The tf.data pipeline (``reader.pipeline``), the DALI pipeline and the PyTorch
iterable (``reader.dali``, ``reader.torch``) build a :class:`WorkerRead` from
the same options, so they share the file deal, the example counts, the batch
counts, the padding and the read order (``reader.plan``). No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import secrets

from reader.info import load_index, split_shards
from reader.options import DEFAULT_CYCLE, ReadOptions
from reader.plan import ReadPlan
from schemas.info import DatasetError

log = logging.getLogger(__name__)


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


@dataclasses.dataclass(frozen=True)
class WorkerRead:
    """One worker's read of a split (see :meth:`of`).

    Attributes:
        shards: the worker's files, [{path, num_examples, num_bytes, index, table}]
            (``table``: the checked DALI index, [[offset, size]]; None for gzip).
        num_examples: examples the worker reads an epoch.
        shuffle, seed: whether it shuffles, and the seed (drawn when none was given).
        plan: the read order.
        start: the first record read, counted over all epochs.
        remaining: elements yielded from ``start`` on (batches, or examples
            without a batch size); None: endless.
        real_batches: with ``pad_final_batch``, batches holding real examples.
    """

    shards: list[dict]
    num_examples: int
    shuffle: bool
    seed: int | None
    plan: ReadPlan
    start: int
    remaining: int | None
    real_batches: int

    @classmethod
    def of(cls, info: dict, data_dir: str, split: str, batch_size, o: ReadOptions) -> WorkerRead:
        """Checks the options and the split's shards; deals the files; plans the order."""
        shards = split_shards(info, data_dir, split)
        shuffle = o.shuffles(split)
        _check(o, batch_size, shuffle)
        if not shards:
            raise DatasetError(f"split {split!r} of {data_dir} has no examples")
        n_workers, index = o.workers()
        _warn_uneven(split, len(shards), n_workers)
        mine, num_examples, stride = worker_plan(shards, n_workers, index)
        # the count read is the count listed: each shard's index describes it exactly
        mine = [{**s, "table": load_index(s)} for s in mine]
        seed = o.seed
        if seed is None and (shuffle or o.random_crop):
            seed = secrets.randbelow(2**31 - 1)  # a fresh one
        at_once = o.cycle_length or DEFAULT_CYCLE
        plan = ReadPlan(
            counts=[s["num_examples"] for s in mine],
            seed=seed if shuffle else None,
            cycle=at_once,
            block=o.block_length,
            window=o.shuffle_buffer,
            stride=stride,
            offset=index if stride > 1 else 0,
            # fewer shards than runs read at once: cut each into more runs (reader/plan.py)
            parts=-(-at_once // len(mine)),
        )
        plan = dataclasses.replace(plan, cycle=min(at_once, plan.num_runs))
        start = o.start_epoch * num_examples + o.start_step * (batch_size or 1)
        most = max(worker_plan(shards, n_workers, w)[1] for w in range(n_workers))
        remaining = _remaining(o, batch_size, num_examples, most, start)
        real = math.ceil(max(num_examples - start, 0) / batch_size) if batch_size else 0
        return cls(mine, num_examples, shuffle, seed, plan, start, remaining, real)


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


def _remaining(o: ReadOptions, batch_size, num_examples: int, most: int, start: int):
    """Elements (batches, or examples without a batch size) yielded from record ``start``
    (counted over all epochs) on; None: endless. Batches come after the epochs are
    joined, so they run across epoch boundaries."""
    if o.epochs is None:
        return None
    unit = batch_size or 1
    if o.pad_final_batch:
        # Every worker yields the same batch count (that of the worker with the
        # most examples), so collective evaluation steps never wait on one.
        left = math.ceil(most / unit) - o.start_step
    else:
        records = num_examples * o.epochs - start
        left = records // unit if o.drop_remainder else math.ceil(records / unit)
    if left < 0:
        raise ValueError(
            f"start_epoch {o.start_epoch}, start_step {o.start_step} is past the end of "
            f"this read ({o.epochs} epochs of {num_examples} examples on this worker)"
        )
    return left


def _check(o: ReadOptions, batch_size: int | None, shuffle: bool) -> None:
    """Options that only conflict given the batch size and the split's default shuffle."""
    if batch_size is not None and (
        not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool)
    ):
        raise TypeError(f"batch_size must be a whole number (int) or None, got {batch_size!r}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    if o.pad_final_batch and (batch_size is None or o.drop_remainder):
        raise ValueError("pad_final_batch needs a batch_size and drop_remainder=False")
    if o.pad_final_batch and (shuffle or o.epochs != 1 or o.start_epoch):
        raise ValueError(
            "pad_final_batch is for evaluation: use shuffle=False, epochs=1 (and start_step, "
            "not start_epoch, to resume)"
        )
    if o.decode and batch_size is not None and o.image_size is None:
        raise ValueError(
            "decoded images differ in size: give image_size=(height, width) to "
            "batch them, or batch_size=None, or decode=False"
        )
    if (o.start_step or o.start_epoch) and (shuffle or o.random_crop) and o.seed is None:
        raise ValueError(
            "start_step and start_epoch resume a seeded read: pass the seed of the run "
            "being resumed (an unseeded shuffle cannot be repeated)"
        )
