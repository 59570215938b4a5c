"""The mixing schedule: which source gives each record of a mixed stream (``reader.mix``).

Record k of source i has the virtual time ``(k + u_i) / w_i`` (w_i its weight relative
to the largest, u_i a seeded offset in [0, 1)); the mixed stream is every source's
records in time order. So any run of records holds each source's share of the weights
to within one record, the same on every machine, and the position of every source after
c mixed records is computable (binary search on the time), which is what a resumed read
starts from. A source that runs out (a finite read) stops giving records and the others
go on at their weights: every record of every source is read, each once an epoch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from reader.order.draws import MIX, draws
from schemas.errors import InvalidValueError


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
        return draws(len(self.weights), self.seed, MIX).astype(np.float64) / 2.0**64

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
            raise InvalidValueError(
                f"position {c} is past the end of the mix ({self.size} records)"
            )
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
