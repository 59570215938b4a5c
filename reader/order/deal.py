"""Which files each worker reads, and the read plan of one worker: pure functions of the
shards' example counts, the worker count and the worker's index.

Files are dealt round-robin (disjoint). With fewer files than workers, every worker
reads all files and keeps every ``workers``-th record (``stride``), from its index.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from reader.order.plan import ReadPlan


def deal(counts, workers: int, index: int) -> tuple[list[int], int, int]:
    """(the worker's files as indices into ``counts``, its examples an epoch, the stride)."""
    counts = [int(c) for c in counts]
    if len(counts) < workers:
        return list(range(len(counts))), len(range(index, sum(counts), workers)), workers
    files = list(range(index, len(counts), workers))
    return files, sum(counts[f] for f in files), 1


def split_ids(counts, workers: int, index: int) -> np.ndarray:
    """Split-wide record ids (shards in their listed order) of a worker's record ids
    (``ReadPlan.epoch_order``'s): ``split_ids(...)[local_id]``."""
    counts = np.asarray(counts, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if len(counts) < workers:  # every worker numbers all the records
        return np.arange(int(counts.sum()), dtype=np.int64)
    files = np.arange(index, len(counts), workers)
    return np.concatenate([starts[f] + np.arange(counts[f]) for f in files]).astype(np.int64)


def worker_plan(
    counts,
    workers: int,
    index: int,
    seed: int | None,
    cycle: int,
    block: int,
    window: int,
    whole: bool = False,
) -> ReadPlan:
    """The read order of one worker (``seed`` None: unshuffled): ``cycle`` runs read at
    once, ``block`` records from each in turn, windows of ``window`` permuted; or, with
    ``whole`` (records read by place), one permutation of its records an epoch."""
    files, _, stride = deal(counts, workers, index)
    plan = ReadPlan(
        counts=[int(counts[f]) for f in files],
        seed=seed,
        cycle=cycle,
        block=block,
        window=window,
        stride=stride,
        offset=index if stride > 1 else 0,
        # fewer shards than runs read at once: cut each into more runs (reader.order.plan)
        parts=-(-cycle // len(files)),
        whole=whole,
    )
    return dataclasses.replace(plan, cycle=min(cycle, plan.num_runs))
