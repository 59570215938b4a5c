"""The read order of one worker's share of a split, computed from a few integers.

An epoch ``e`` of a worker reads its files as **runs** (consecutive records of
one file). Unshuffled, a run is a whole file, in stored order. Shuffled, each
file is cut into ``parts + 1`` runs at seeded points, one drawn in each
``1/parts`` of the file and new every epoch, and all runs are put in a seeded
order, new every epoch. Runs are read ``cycle`` at a time: group ``g`` is
runs ``[g*cycle, (g+1)*cycle)``, read round-robin, ``block`` records from
each run in turn, and finished before the next group starts. When workers
share files (fewer files than workers) a worker keeps every ``stride``-th
record of that stream from ``offset``. Consecutive windows of ``window`` of
the worker's records are then each permuted by a seeded permutation of
(seed, epoch, window index).

Why cut files at new points every epoch: with whole files, record ``j`` of
every file would land in the same window every epoch, so windows would hold
the same records every epoch (neighbours repeating 4x more often than
tf.data's ``shuffle(buffer)`` of the same size). With runs starting at
random points, which records meet changes every epoch; with ``parts`` at
least ``cycle / files``, a worker with few shards (one, even) still reads
``cycle`` runs at once. A run that starts inside a file costs a raw skip to
its start (tf.data hops over record headers: a third of a raw read or less).

Where every record can be fetched by its place (local, uncompressed shards: their
DALI index holds each record's offset), a shuffled epoch is simpler and better: one
seeded permutation of all the worker's records (``whole``), new every epoch, read by
place. Records that meet in a batch in one epoch then meet in the next no more often
than under an independent shuffle (with runs and windows, records written close
stayed close: neighbours repeated 5x more often). The runs and windows stay for
what cannot be read by place (a bucket's shards, which the cache fetches in runs
under its bound; gzip shards, which have no index).

Every piece is a pure function of (seed, epoch, position), so a reader can
start at any position without parsing or decoding what comes before: it
opens the group in flight, skips in each of its runs the records already
given (a raw skip, within one shard), and rebuilds the window
(:meth:`ReadPlan.resume`). This replaces tf.data's ``shuffle(buffer)``, whose
state is the buffer itself. No TensorFlow here: tests, the tf.data pipeline
and other frameworks compute the same order from this module.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from reader.order.draws import CUTS, ORDER, RUNS, WINDOW, draws, permutation
from schemas.errors import InvalidValueError


@dataclasses.dataclass(frozen=True)
class Runs:
    """Runs of records, in read order: file index, first record, end (exclusive)."""

    file: np.ndarray
    start: np.ndarray
    stop: np.ndarray


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where an epoch's reading starts, for a given position in it.

    Attributes:
        runs: runs to read, in order: the group in flight (each run's start
            moved past what it already gave) and every later one.
        raw_skip: records of the interleaved stream to skip after that (less
            than one round of the group: the round in progress).
        first_window: index of the first window read.
        tail_skip: records of the (permuted) first window to drop.
    """

    runs: Runs
    raw_skip: int
    first_window: int
    tail_skip: int


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The read order of a worker's files; see the module docstring.

    Attributes:
        counts: examples in each of the worker's files, in their stored order.
        seed: None reads whole files in stored order (no permutations).
        cycle: runs read at once (a group).
        block: consecutive records taken from a run in turn.
        window: records permuted together (0: none).
        stride, offset: this worker keeps raw records ``offset::stride``.
        parts: with a seed, each file is cut into ``parts + 1`` runs.
        whole: with a seed, each epoch is one permutation of the worker's records
            (those of files it shares with others dealt ``offset::stride`` of it),
            read by place: no runs, groups or windows.
    """

    counts: tuple[int, ...]
    seed: int | None
    cycle: int
    block: int = 1
    window: int = 0
    stride: int = 1
    offset: int = 0
    parts: int = 1
    whole: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        if not self.counts or min(self.cycle, self.block, self.parts) < 1 or self.window < 0:
            raise InvalidValueError(f"invalid read plan {self}")
        if not 0 <= self.offset < self.stride:
            raise InvalidValueError(f"offset {self.offset} outside stride {self.stride}")

    @functools.cached_property
    def _counts(self) -> np.ndarray:
        return np.array(self.counts, np.int64)

    @functools.cached_property
    def _starts(self) -> np.ndarray:
        """Global id of each file's first record (files in stored order)."""
        return np.concatenate([[0], np.cumsum(self._counts)[:-1]]).astype(np.int64)

    @property
    def size(self) -> int:
        """Records this worker reads in one epoch."""
        return len(range(self.offset, int(self._counts.sum()), self.stride))

    @property
    def num_runs(self) -> int:
        """Runs an epoch reads (the same every epoch)."""
        return len(self.counts) * (1 if self.seed is None else self.parts + 1)

    @property
    def windowed(self) -> bool:
        return self.seed is not None and self.window > 0 and not self.by_place

    @property
    def by_place(self) -> bool:
        """Each epoch one permutation of the records, read by place (``whole``)."""
        return self.whole and self.seed is not None

    def runs(self, epoch) -> Runs:
        """The runs of epoch ``epoch`` in read order (some may be empty)."""
        n = self._counts
        files = np.arange(len(n), dtype=np.int64)
        if self.seed is None:
            return Runs(files, np.zeros_like(n), n.copy())
        k = np.arange(self.parts + 1, dtype=np.int64)
        grid = k[None, :] * n[:, None] // self.parts  # [files, parts + 1]
        gaps = np.diff(grid, axis=1)  # records in each 1/parts of a file
        drawn = draws(gaps.size, self.seed, CUTS, int(epoch)).reshape(gaps.shape)
        cuts = grid[:, :-1] + (drawn % (gaps + 1).astype(np.uint64)).astype(np.int64)
        bounds = np.concatenate([np.zeros((len(n), 1), np.int64), cuts, n[:, None]], axis=1)
        order = permutation(self.num_runs, self.seed, RUNS, int(epoch))
        return Runs(
            np.repeat(files, self.parts + 1)[order],
            bounds[:, :-1].reshape(-1)[order],
            bounds[:, 1:].reshape(-1)[order],
        )

    def window_permutation(self, epoch, window, size) -> np.ndarray:
        return permutation(int(size), self.seed, WINDOW, int(epoch), int(window))

    def _group_order(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, record offset in its run) of one group's round-robin, in read order."""
        slots = np.repeat(np.arange(len(counts)), counts)
        offsets = np.concatenate([np.arange(c) for c in counts])
        order = np.lexsort((offsets, slots, offsets // self.block))
        return slots[order], offsets[order]

    def raw_order(self, epoch) -> tuple[np.ndarray, np.ndarray]:
        """The worker's records as its groups give them, before the window permutations:
        their global ids (file start + record index), and the group each is read in."""
        runs = self.runs(epoch)
        first = self._starts[runs.file] + runs.start
        parts = []
        for g in range(0, self.num_runs, self.cycle):
            slots, offsets = self._group_order((runs.stop - runs.start)[g : g + self.cycle])
            parts.append(first[g : g + self.cycle][slots] + offsets)
        group = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        keep = slice(self.offset, None, self.stride)
        return np.concatenate(parts)[keep], group[keep]

    def groups(self, start: int, epochs: int | None):
        """The runs of each group (``Runs``), in the order a read from ``start`` (counted
        over all epochs) opens them: every group, those that give this worker nothing
        too, the first one's runs moved past what they gave. The bucket cache fetches
        along it."""
        epoch, position = divmod(start, self.size)
        end = (1 << 62) if epochs is None else epochs
        if epoch >= end:
            return
        runs = self.resume(epoch, position).runs
        while True:
            for g in range(0, len(runs.file), self.cycle):
                part = slice(g, g + self.cycle)
                yield Runs(runs.file[part], runs.start[part], runs.stop[part])
            epoch += 1
            if epoch >= end:
                return
            runs = self.runs(epoch)

    def epoch_order(self, epoch) -> np.ndarray:
        """Global ids (file start + record index) of the worker's records in read order."""
        if self.by_place:
            total = int(self._counts.sum())
            return permutation(total, self.seed, ORDER, int(epoch))[self.offset :: self.stride]
        ids = self.raw_order(epoch)[0]
        if self.windowed:
            for w, start in enumerate(range(0, len(ids), self.window)):
                chunk = ids[start : start + self.window]
                ids[start : start + len(chunk)] = chunk[
                    self.window_permutation(epoch, w, len(chunk))
                ]
        return ids

    def resume(self, epoch: int, position: int) -> Resume:
        """How to read epoch ``epoch`` from record ``position`` of the worker's order on."""
        if not 0 <= position < self.size:
            raise InvalidValueError(f"position {position} outside the epoch's {self.size} records")
        first = position - position % self.window if self.windowed else position
        raw = self.offset + first * self.stride  # position in the interleaved stream
        runs, c = self.runs(epoch), self.cycle
        counts = runs.stop - runs.start
        ends = np.cumsum([counts[g : g + c].sum() for g in range(0, len(counts), c)])
        g = int(np.searchsorted(ends, raw, side="right"))
        into_group = raw - (int(ends[g - 1]) if g else 0)
        group = counts[g * c : (g + 1) * c]
        # Records the group has given after each whole round; the last round
        # boundary at or before the position is where its runs are opened.
        rounds = np.arange(-(-int(group.max()) // self.block) + 1)[:, None]
        given = np.minimum(rounds * self.block, group).sum(axis=1)
        r = int(np.searchsorted(given, into_group, side="right")) - 1
        start = runs.start[g * c :].copy()
        start[: len(group)] += np.minimum(r * self.block, group)
        return Resume(
            runs=Runs(runs.file[g * c :], start, runs.stop[g * c :]),
            raw_skip=into_group - int(given[r]),
            first_window=first // self.window if self.windowed else 0,
            tail_skip=position - first,
        )
