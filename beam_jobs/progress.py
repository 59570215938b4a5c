"""Progress of a running conversion, on stderr, from every worker.

Each stage counts its elements in the worker that runs it and writes a line
at most every ``EVENSHARD_PROGRESS_SECONDS`` (default 5): stage, count,
rate, worker. The same counts are Beam metrics (``files_listed``,
``images_read``, ``records_written``), which Dataflow's console shows. Plain
lines rather than a bar: workers are separate processes (or machines), and
no one worker knows the total.
"""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """Counts one stage's elements in this worker; reports at most every few seconds."""

    def __init__(self, stage: str, unit: str):
        self.stage, self.unit = stage, unit
        self.every = float(os.environ.get("EVENSHARD_PROGRESS_SECONDS", "5"))
        self.done = 0
        self._start = self._last = None

    def add(self, n: int = 1) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = self._last = now
        self.done += n
        if now - self._last >= self.every:
            self._last = now
            rate = self.done / max(now - self._start, 1e-6)
            # Progress is what the user watches, not a log record: straight to
            # stderr, flushed, so it shows from worker processes too.
            sys.stderr.write(
                f"evenshard: {self.stage}: {self.done:,} {self.unit} "
                f"({rate:,.0f}/s, worker {os.getpid()})\n"
            )
            sys.stderr.flush()
