"""InspectImages: every input inspected (``convert_core.inspection``) over workers, a
few files at a time in threads where the runner is local, and its rejects routed."""

from __future__ import annotations

import collections
import os
from concurrent.futures import Future, ThreadPoolExecutor

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.dead_letters import SplitRejects
from beam_jobs.near_embedding import Embedder
from convert_core import paths
from convert_core.inspection import Inspector, image_of, outcome
from convert_core.records import Candidate, Image
from schemas.progress import Progress


class InspectImage(beam.DoFn):
    """Candidate -> Image, or a Reject (see dead_letters.py); a source that holds the
    bytes (``tfrecord_source``) calls ``inspect_bytes`` and ``image`` itself.

    ``threads`` > 1: local files are inspected that many at a time (reading and
    libjpeg's decode release the GIL), the results given in the order of the
    candidates; for a local run with fewer workers than cores (``local_threads``).
    """

    def __init__(self, inspector: Inspector, embedding: str | None = None, threads: int = 1):
        self._threads = threads
        self._embedding = embedding  # --near_embedding: the pixels kept for it
        self._inspector = inspector
        self._read = Metrics.counter("evenshard", "images_read")
        self._bytes = Metrics.counter("evenshard", "bytes_read")

    def setup(self):
        self._progress = Progress("inspect", "images")
        self._inspector.setup()
        self._pool = ThreadPoolExecutor(self._threads) if self._threads > 1 else None
        self.embedder = None  # --near_embedding: the function, a batch of images at a time
        if self._embedding is not None:
            self.embedder = Embedder(self._embedding)
            self.embedder.setup()

    def start_bundle(self):
        self._pending = collections.deque()  # (Candidate, source, Future), in order

    def process(self, c: Candidate):
        source = self._inspector.source(c)
        inspect = self._inspector.inspect
        if self._pool is None:
            yield from self.embedded(self._outcome(c, source, _now(inspect, source)))
            return
        # a bucket's client stays on this thread
        inspecting = _now if paths.is_url(source) else self._pool.submit
        self._pending.append((c, source, inspecting(inspect, source)))
        while len(self._pending) > 2 * self._threads:
            yield from self.embedded(self._outcome(*self._pending.popleft()))

    def finish_bundle(self):
        while self._pending:
            for out in self.embedded(self._outcome(*self._pending.popleft())):
                yield GlobalWindows.windowed_value(out)
        for out in self.embedder.flush() if self.embedder else ():
            yield GlobalWindows.windowed_value(out)

    def embedded(self, outcome) -> list:
        """What is ready once ``outcome`` is taken in (``--near_embedding``: the images are
        embedded a batch at a time, ``Embedder``); else the outcome itself."""
        return self.embedder.add(outcome) if self.embedder else [outcome]

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _outcome(self, c: Candidate, source: str, inspected: Future):
        """The Image of ``c``, or its Reject (``outcome``; counted here: Beam's counters are
        the bundle's thread's)."""
        out = outcome(c, source, inspected.result)
        if isinstance(out, Image):
            self._count(out)
        return out

    def _count(self, image: Image) -> None:
        self._read.inc()
        self._bytes.inc(image.num_bytes)
        self._progress.add()

    def image(self, c: Candidate, found: tuple) -> Image:
        """The Image of a candidate and what inspecting it found (counted)."""
        image = image_of(c, found)
        self._count(image)
        return image

    def inspect_bytes(self, data: bytes) -> tuple:
        """``Inspector.inspect_bytes``: what an image held in memory is."""
        return self._inspector.inspect_bytes(data)

    def read_whole(self, source: str) -> bytes:
        """``Inspector.read_whole``: a file's bytes, read whole as inspection reads one."""
        return self._inspector.read_whole(source)


def _now(fn, *args) -> Future:
    """``fn(*args)`` run here, as a done Future (its result or its exception)."""
    done = Future()
    try:
        done.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - given back by result(), as the pool's are
        done.set_exception(e)
    return done


def local_threads(options) -> int:
    """Inspections at once in each worker of a run: on the local runner, its machine's
    cores over its worker processes (one in-memory worker on 2 cores: 2); 1 anywhere
    else (a remote worker's cores are its runner's business)."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    from beam_jobs.runners import runs_locally

    runner = options.view_as(StandardOptions).runner
    if not isinstance(runner, (str, type(None))) or not runs_locally(
        [f"--runner={runner}"] if runner else []
    ):
        return 1
    direct = options.view_as(DirectOptions)
    cores = os.cpu_count() or 1
    workers = 1 if direct.direct_running_mode == "in_memory" else direct.direct_num_workers
    return max(1, cores // (workers or cores))


class InspectImages(beam.PTransform):
    """Candidate -> {main: Image, rejects: Reject}: each candidate's file inspected by
    ``inspector`` (``convert_core.inspection.Inspector``: the checks, limits and
    fingerprints convert's flags ask for); ``embedding``: ``--near_embedding``'s
    MODULE:FUNCTION, whose vector is the fingerprint instead (``beam_jobs.near_embedding``).
    """

    def __init__(self, inspector: Inspector, embedding: str | None = None):
        super().__init__()
        self._inspector, self._embedding = inspector, embedding

    @property
    def arguments(self) -> tuple:
        """``InspectImage``'s arguments (a source that inspects as it reads makes its own)."""
        return (self._inspector, self._embedding)

    def expand(self, candidates):
        # Candidate -> Image | Reject
        threads = local_threads(candidates.pipeline.options)
        inspect = InspectImage(*self.arguments, threads=threads)
        inspected = candidates | "Inspect" >> beam.ParDo(inspect)
        return inspected | "SplitRejects" >> SplitRejects()
