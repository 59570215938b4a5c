"""Weighted mixing of several evenshard splits: which source each record comes from.

``reader.mix([("out_a/", 0.7), (("out_b/", "val"), 0.3)])`` names the sources; every
reader takes the :class:`Mixture` in place of a dataset folder. Each source is read
as it would be alone (its files, its order, its resume); a :class:`Schedule` says
which source gives each record of the mixed stream. Plain numpy, no TensorFlow.

The schedule: record k of source i has the virtual time ``(k + u_i) / w_i`` (w_i its
weight, u_i a seeded offset in [0, 1)); the mixed stream is every source's records
in time order. So any run of records holds each source's share of the weights to
within one record, the same on every machine, and the position of every source
after c mixed records is computable (binary search on the time), which is what a
resumed read starts from. A source that runs out (a finite read) stops giving
records and the others go on at their weights: every record of every source is
read, each once an epoch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import secrets

import numpy as np

from reader.plan import _draws

_MIX = 4  # purpose of the seeded draws (reader/plan.py uses 1-3)


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Sources and weights of a mixed read: ``sources`` [(data_dir, split)], ``weights``."""

    sources: tuple[tuple[str, str], ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("reader.mix needs at least one source")
        for w in self.weights:
            # numpy scalars (np.float32(0.3), np.int64(3)) are numbers too
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real) or not w > 0:
                raise ValueError(f"mixing weights must be numbers > 0, got {w!r}")
            if not math.isfinite(w):
                raise ValueError(f"mixing weights must be finite, got {w!r}")
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))


def mix(sources, split: str = "train") -> Mixture:
    """A weighted mixture of evenshard splits, for any reader in place of ``data_dir``.

    Args:
        sources: [(source, weight)], a source being a dataset folder (its ``split``)
            or a (folder, split) pair; weights are relative (0.7 and 0.3, or 7 and 3).
        split: the split of sources given as a folder alone.

    Example::

        both = reader.mix([("web/", 0.8), (("curated/", "train"), 0.2)])
        ds = reader.make_dataset(both, batch_size=256, seed=0, image_size=(224, 224))
    """
    pairs, weights = [], []
    for item in sources:
        try:
            source, weight = item
        except (TypeError, ValueError):
            raise ValueError(f"reader.mix takes (source, weight) pairs, got {item!r}") from None
        pairs.append((source, split) if isinstance(source, str) else tuple(source))
        weights.append(weight)
    return Mixture(tuple(pairs), tuple(weights))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which source gives each record of a mixed stream (see the module docstring).

    Attributes:
        weights: of the sources.
        seed: draws each source's offset.
        totals: records each source has (None: endless).
    """

    weights: tuple[float, ...]
    seed: int
    totals: tuple[int | None, ...]

    @property
    def _w(self) -> np.ndarray:
        # relative to the largest: the times (k + u) / w then stay at most the record
        # counts, whatever the weights' scale (1e19 overflowed int64: the search never ended)
        w = np.asarray(self.weights, np.float64)
        return w / w.max()

    @property
    def _u(self) -> np.ndarray:
        return _draws(len(self.weights), self.seed, _MIX).astype(np.float64) / 2.0**64

    @property
    def size(self) -> int | None:
        """Records of the mixed stream (None: endless)."""
        return None if None in self.totals else sum(self.totals)

    def _given(self, t: float) -> np.ndarray:
        """Records of each source with a time <= t."""
        k = np.floor(t * self._w - self._u) + 1
        cap = np.array([np.inf if n is None else n for n in self.totals])
        return np.clip(k, 0, cap).astype(np.int64)

    def counts(self, c: int) -> np.ndarray:
        """Records of each source among the first ``c`` of the mixed stream."""
        if self.size is not None and c > self.size:
            raise ValueError(f"position {c} is past the end of the mix ({self.size} records)")
        if c == 0:
            return np.zeros(len(self.weights), np.int64)
        lo, hi = 0.0, 1.0
        while self._given(hi).sum() < c:
            hi *= 2
        for _ in range(200):  # bisection to the time of the c-th record
            mid = (lo + hi) / 2
            if self._given(mid).sum() >= c:
                hi = mid
            else:
                lo = mid
            if hi - lo <= hi * 1e-15:
                break
        counts = self._given(hi)
        extra = int(counts.sum()) - c  # records at the very same time: the later sources
        for i in reversed(range(len(counts))):
            if extra <= 0:
                break
            if counts[i] and self._time(i, counts[i] - 1) >= lo:
                counts[i] -= 1
                extra -= 1
        return counts

    def _time(self, i: int, k) -> np.ndarray:
        return (np.asarray(k, np.float64) + self._u[i]) / self._w[i]

    def choices(self, start: int, stop: int) -> np.ndarray:
        """The source of each mixed record in [start, stop) (fewer at the end of a mix)."""
        if self.size is not None:
            stop = min(stop, self.size)
        if stop <= start:
            return np.zeros(0, np.int64)
        first = self.counts(start)
        times, sources = [], []
        for i, k in enumerate(first):
            n = stop - start
            if self.totals[i] is not None:
                n = min(n, self.totals[i] - int(k))
            ks = np.arange(k, k + n)
            times.append(self._time(i, ks))
            sources.append(np.full(len(ks), i, np.int64))
        times, sources = np.concatenate(times), np.concatenate(sources)
        order = np.lexsort((sources, times))
        return sources[order][: stop - start]


@dataclasses.dataclass(frozen=True)
class MixRead:
    """One worker's read of a :class:`Mixture`: every source's own read (a
    ``WorkerRead`` of single records, as if it were read alone) and the schedule.

    Attributes:
        parts: [(info, data_dir, split, WorkerRead)], each read positioned where the
            mixed stream continues.
        schedule: which source gives each mixed record of this read.
        start: mixed records of this read already behind (the schedule's position).
        remaining, real_batches, state: as ``WorkerRead``'s.
        seed: the read's seed.
    """

    parts: list[tuple]
    schedule: Schedule
    start: int
    remaining: int | None
    real_batches: int
    state: object
    seed: int

    @classmethod
    def of(cls, mixture: Mixture, batch_size, o, state=None) -> MixRead:
        """Checks the sources fit together; resolves each source's read (a saved state
        resumes it, with any worker count for an endless read); plans the schedule."""
        from reader.state import ReadState
        from reader.worker import WorkerRead, _remaining
        from schemas.info import load_info

        infos = [load_info(d) for d, _ in mixture.sources]
        _check_sources(mixture, infos)
        if o.start_epoch:
            raise ValueError("a mixed read starts by start_step (mixed batches), not start_epoch")
        unit = batch_size or 1
        n_workers, _ = o.workers()
        order = "weights=" + ",".join(f"{w:g}" for w in mixture.weights)
        if state is not None and state.parts is None and state.num_workers is None:
            # a new state (``ReadState(seed, batch_size, step=k)``): a new read from step k
            if state.epoch:
                raise ValueError("a mixed read starts by step (mixed batches), not epoch")
            o = dataclasses.replace(
                o, seed=state.seed, start_step=state.step * state.batch_size // unit
            )
            state = None
        if state is None:
            seed = o.seed if o.seed is not None else secrets.randbelow(2**31 - 1)
            parts = [ReadState(seed, 1) for _ in infos]
            consumed = o.start_step * unit
        else:
            if state.parts is None or len(state.parts) != len(infos):
                raise ValueError("the state was not saved by a mixed read of these sources")
            if o.seed is not None and o.seed != state.seed:
                raise ValueError(
                    f"the state was saved with seed {state.seed}, options give {o.seed}"
                )
            if o.start_step:
                raise ValueError("resume takes the start from the state: leave start_step 0")
            if state.order != order:
                raise ValueError(
                    f"the state was saved mixing with {state.order}, now {order}: the sources "
                    "would be read twice or skipped; mix with the saved weights"
                )
            seed = state.seed
            parts = [ReadState.from_json(p) for p in state.parts]
            consumed = state.step * state.batch_size
            if (state.num_workers or n_workers) != n_workers:  # each source resumes elastically
                if o.epochs is not None:
                    raise ValueError(
                        "a finite mixed read resumes with the saved worker count only (its "
                        "schedule depends on each worker's counts); read with epochs=None"
                    )
                given = Schedule(mixture.weights, seed, (None,) * len(infos)).counts(consumed)
                parts = [p.advance(int(k)) for p, k in zip(parts, given)]
                consumed = 0
        part_o = dataclasses.replace(
            o, seed=seed, pad_final_batch=False, drop_remainder=False, start_step=0
        )
        reads = [
            WorkerRead.of(info, d, split, None, part_o, part)
            for info, (d, split), part in zip(infos, mixture.sources, parts)
        ]
        schedule = Schedule(mixture.weights, seed, tuple(r.remaining for r in reads))
        given = schedule.counts(consumed)
        left = most = None
        if schedule.size is not None:
            left = schedule.size - consumed
            most = max(sum(r.lefts[w] for r in reads) for w in range(n_workers)) - consumed
        remaining, real = _remaining(o, batch_size, left, most)
        resumed = ReadState(
            seed,
            unit,
            step=consumed // unit,
            num_workers=n_workers,
            order=order,
            parts=tuple(r.state.to_json() for r in reads),
        )
        placed = [
            (info, d, split, r.skip(int(k)))
            for info, (d, split), r, k in zip(infos, mixture.sources, reads, given)
        ]
        return cls(placed, schedule, consumed, remaining, real, resumed, seed)


def _check_sources(mixture: Mixture, infos: list[dict]) -> None:
    """Sources of one mixture share their labels (ids mean the same) and record kind."""
    first = infos[0]
    for (d, split), info in zip(mixture.sources, infos):
        if split not in info["splits"]:
            raise ValueError(f"reader.mix: {d} has no split {split!r}")
        if info["labels"] != first["labels"] or info["record_kind"] != first["record_kind"]:
            raise ValueError(
                f"reader.mix: {d} has other labels or another record kind than "
                f"{mixture.sources[0][0]}: mixed sources share labels.txt (the same label "
                "ids) and the record kind"
            )
        if info["record_kind"] == "path" and info.get("path_root") != first.get("path_root"):
            raise ValueError("reader.mix: path records of mixed sources share one path_root")
