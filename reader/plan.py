"""The read order of one worker's share of a split, computed from a few integers.

An epoch ``e`` of a worker reads its files in an order (a seeded permutation,
new every epoch, when shuffling; stored order otherwise), ``cycle`` files at a
time: group ``g`` is files ``order[g*cycle:(g+1)*cycle]``, read round-robin,
``block`` records from each file in turn, and finished before the next group
starts. When workers share files (fewer files than workers) a worker keeps
every ``stride``-th record of that stream from ``offset``. Consecutive windows
of ``window`` of the worker's records are then each permuted by a seeded
permutation of (seed, epoch, window index).

When shuffling, each file of a group also starts ``lead`` turns late (a
seeded draw per file and epoch, below the largest shard's count): a file
with lead 40 gives nothing for its first 40 records' turns. Without leads,
record ``j`` of every file would land in the same window every epoch, and
windows would hold the same records every epoch (neighbours repeating 4x
more often than tf.data's shuffle buffer of the same size); with them, which
records meet changes every epoch. A lead costs no IO: the reader pads the
file with empty placeholders and drops them after the interleave.

The plan's "files" may be segments of files (:func:`segments`): a worker
with fewer shards than ``cycle`` reads each shard as several runs of
records, so that one shard's records meet other records every epoch too.
A run starting inside a shard costs a raw skip to its start (tf.data hops
over record headers: about a third of a raw read).

Every piece is a pure function of (seed, epoch, position), so a reader can
start at any position without reading, parsing or decoding what comes before:
it opens the group in flight, skips the raw records each of its files has
already given (at most one shard's worth per file), and rebuilds the window
(:meth:`ReadPlan.resume`). This replaces tf.data's ``shuffle(buffer)``, whose
state is the buffer itself. No TensorFlow here: tests, the tf.data pipeline
and other frameworks compute the same order from this module.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

_FILES, _WINDOW, _LEADS = 1, 2, 3  # purposes of the seeded draws
_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def permutation(n: int, *key: int) -> np.ndarray:
    """A seeded permutation of ``range(n)``: the same for the same key on any machine.

    Sorting hashed indices (not ``numpy.random``, whose streams may change
    between numpy versions) keeps the order stable across installs.
    """
    h = np.zeros(1, np.uint64)
    for part in key:
        h = _mix(h ^ np.uint64(int(part) & _MASK64))
    return np.argsort(_mix(np.arange(n, dtype=np.uint64) ^ h), kind="stable").astype(np.int64)


def segments(counts, parts: int) -> list[tuple[int, int, int]]:
    """Each file cut into ``parts`` runs of records as equal as can be (none empty):
    (file index, first record, records), in stored order."""
    out = []
    for f, n in enumerate(counts):
        k = max(1, min(parts, n))
        cuts = [n * i // k for i in range(k + 1)]
        out += [(f, cuts[i], cuts[i + 1] - cuts[i]) for i in range(k)]
    return out


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where an epoch's reading starts, for a given position in it.

    Attributes:
        files: files to read, in order: the group in flight and every later one.
        leads: turns each of ``files`` still waits before giving records.
        skips: raw records to skip at the start of each of ``files``.
        raw_skip: records of the interleaved stream to skip after that (less
            than one round of the group: the round in progress).
        first_window: index of the first window read.
        tail_skip: records of the (permuted) first window to drop.
    """

    files: np.ndarray
    leads: np.ndarray
    skips: np.ndarray
    raw_skip: int
    first_window: int
    tail_skip: int


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The read order of a worker's files; see the module docstring.

    Attributes:
        counts: examples in each of the worker's files, in their stored order.
        seed: None reads files and records in stored order (no permutations).
        cycle: files read at once (a group).
        block: consecutive records taken from a file in turn.
        window: records permuted together (0: none).
        stride, offset: this worker keeps raw records ``offset::stride``.
    """

    counts: tuple[int, ...]
    seed: int | None
    cycle: int
    block: int = 1
    window: int = 0
    stride: int = 1
    offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        if not self.counts or self.cycle < 1 or self.block < 1 or self.window < 0:
            raise ValueError(f"invalid read plan {self}")
        if not 0 <= self.offset < self.stride:
            raise ValueError(f"offset {self.offset} outside stride {self.stride}")

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
    def windowed(self) -> bool:
        return self.seed is not None and self.window > 0

    def file_order(self, epoch) -> np.ndarray:
        n = len(self.counts)
        if self.seed is None:
            return np.arange(n, dtype=np.int64)
        return permutation(n, self.seed, _FILES, int(epoch))

    def leads(self, epoch) -> np.ndarray:
        """Turns each file (in stored order) waits before giving records, in epoch ``epoch``."""
        n = len(self.counts)
        if self.seed is None:
            return np.zeros(n, np.int64)
        h = _mix(np.zeros(1, np.uint64) ^ np.uint64(self.seed & _MASK64))
        h = _mix(_mix(h ^ np.uint64(_LEADS)) ^ np.uint64(int(epoch)))
        draws = _mix(np.arange(n, dtype=np.uint64) ^ h) % np.uint64(max(self.counts))
        return draws.astype(np.int64)

    def epoch_files(self, epoch) -> tuple[np.ndarray, np.ndarray]:
        """(files in read order, their leads)."""
        order = self.file_order(epoch)
        return order, self.leads(epoch)[order]

    def window_permutation(self, epoch, window, size) -> np.ndarray:
        return permutation(int(size), self.seed, _WINDOW, int(epoch), int(window))

    def _group_order(self, counts: np.ndarray, leads: np.ndarray):
        """(slot, record) pairs of one group's round-robin, in read order."""
        slots = np.repeat(np.arange(len(counts)), counts)
        records = np.concatenate([np.arange(c) for c in counts])
        turns = records + leads[slots]  # the file's turn that gives the record
        order = np.lexsort((turns, slots, turns // self.block))
        return slots[order], records[order]

    def epoch_order(self, epoch) -> np.ndarray:
        """Global ids (file start + record index) of the worker's records in read order."""
        order, leads = self.epoch_files(epoch)
        parts = []
        for g in range(0, len(order), self.cycle):
            files = order[g : g + self.cycle]
            slots, records = self._group_order(self._counts[files], leads[g : g + self.cycle])
            parts.append(self._starts[files[slots]] + records)
        ids = np.concatenate(parts)[self.offset :: self.stride]
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
            raise ValueError(f"position {position} outside the epoch's {self.size} records")
        first = position - position % self.window if self.windowed else position
        raw = self.offset + first * self.stride  # position in the interleaved stream
        order, leads = self.epoch_files(epoch)
        counts = self._counts[order]
        c = self.cycle
        ends = np.cumsum([counts[g : g + c].sum() for g in range(0, len(order), c)])
        g = int(np.searchsorted(ends, raw, side="right"))
        into_group = raw - (int(ends[g - 1]) if g else 0)
        group, lead = counts[g * c : (g + 1) * c], leads[g * c : (g + 1) * c]
        # Records the group has given after each whole round; the last round
        # boundary at or before the position is where its files are opened.
        rounds = np.arange(-(-int((group + lead).max()) // self.block) + 1)[:, None]
        given = np.clip(rounds * self.block - lead, 0, group).sum(axis=1)
        r = int(np.searchsorted(given, into_group, side="right")) - 1
        skips = np.zeros(len(order) - g * c, np.int64)
        skips[: len(group)] = np.clip(r * self.block - lead, 0, group)
        leads = leads[g * c :].copy()
        leads[: len(group)] = np.maximum(lead - r * self.block, 0)
        return Resume(
            files=order[g * c :],
            leads=leads,
            skips=skips,
            raw_skip=into_group - int(given[r]),
            first_window=first // self.window if self.windowed else 0,
            tail_skip=position - first,
        )
