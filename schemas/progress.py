"""Progress lines on stderr: one printer for convert's workers and for validate.

Each stage counts its elements in the process that runs it and writes a line
at most every ``EVENSHARD_PROGRESS_SECONDS`` (default 5): stage, count (of
the total, when known), rate, ETA, worker. Convert's counts are also Beam
metrics (``files_listed``, ``images_read``, ``records_written``), which
Dataflow's console shows. Plain lines rather than a bar: convert's workers
are separate processes (or machines), and no one worker knows the total.
"""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """Counts one stage's elements in this process; reports at most every few seconds.

    Args:
        stage, unit: named in each line (``evenshard: inspect: 1,200 images``).
        total: the count when done, if known: lines then say ``done/total`` and an ETA.
    """

    def __init__(self, stage: str, unit: str, total: int | None = None, stream=None):
        self.stage, self.unit, self.total = stage, unit, total
        self.every = float(os.environ.get("EVENSHARD_PROGRESS_SECONDS", "5"))
        self.done = 0
        self._stream = stream
        self._start = self._last = None
        self._first = 0

    def add(self, n: int = 1) -> None:
        now = time.monotonic()
        self.done += n
        if self._start is None:  # the rate counts from the first call (after imports)
            self._start, self._last, self._first = now, now, self.done - n
        if now - self._last < self.every:
            return
        self._last = now
        rate = (self.done - self._first) / max(now - self._start, 1e-6)
        count = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
        eta = ""
        if self.total is not None and rate:
            eta = f", ETA {(self.total - self.done) / rate:,.0f} s"
        # Progress is what the user watches, not a log record: straight to
        # stderr, flushed, so it shows from worker processes too.
        stream = self._stream or sys.stderr
        stream.write(
            f"evenshard: {self.stage}: {count} {self.unit} "
            f"({rate:,.0f}/s{eta}, worker {os.getpid()})\n"
        )
        stream.flush()
