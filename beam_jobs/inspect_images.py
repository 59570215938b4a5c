"""InspectImages: open every input with Pillow and record what it is (the rules:
``schemas.images``; here, reading the files and routing rejects).

``verify="full"`` decodes every image, so truncated and corrupt files are
caught here rather than in the middle of a training run. ``verify="header"``
only parses the header for format and size, and takes the byte size from the
file system: much faster, and still catches most broken files.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import io
import os
import stat
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_jobs.dead_letters import SplitRejects
from beam_jobs.filesystems import open_binary, read_bytes
from beam_jobs.near_embedding import Embedder
from convert_core import paths
from convert_core.records import Candidate, Image, make_reject
from schemas import storage, stores
from schemas.images import MAGIC, Rejected, inspect_stream
from schemas.progress import Progress


def open_error(e: Exception) -> Rejected:
    """Maps a failure to open or read a file to missing / unreadable."""
    cause = e
    # BeamIOError wraps the real OSError in exception_details.
    details = getattr(e, "exception_details", None)
    if isinstance(details, dict) and details:
        cause = next(iter(details.values()))
    if isinstance(cause, FileNotFoundError) or getattr(cause, "errno", None) == errno.ENOENT:
        return Rejected("missing", "file not found")
    if getattr(cause, "errno", None) == errno.ELOOP:
        return Rejected("unreadable", "symlink loop")
    return Rejected("unreadable", f"{type(cause).__name__}: {cause}")


class InspectImage(beam.DoFn):
    """Candidate -> Image, or a Reject (see dead_letters.py); a source that holds the
    bytes (``tfrecord_source``) calls ``inspect_bytes`` and ``image`` itself.

    ``threads`` > 1: local files are inspected that many at a time (reading and
    libjpeg's decode release the GIL), the results given in the order of the
    candidates; for a local run with fewer workers than cores (``local_threads``).
    """

    def __init__(
        self,
        verify: str,
        max_image_pixels: int,
        source_root: str | None,
        max_image_bytes: int,
        hash_content: bool = False,
        near: bool = False,
        embedding: str | None = None,
        threads: int = 1,
    ):
        self._threads = threads
        self._embedding = embedding  # --near_embedding: the pixels kept for it
        self._root = source_root
        self._hash = hash_content
        self._near = near
        self._full = verify == "full"
        self._max_pixels = max_image_pixels
        self._max_bytes = max_image_bytes
        self._read = Metrics.counter("evenshard", "images_read")
        self._bytes = Metrics.counter("evenshard", "bytes_read")

    def setup(self):
        from PIL import Image as PILImage

        self._progress = Progress("inspect", "images")
        # Our own pixel limit applies (too_large); Pillow's global guard would
        # raise before we can say why.
        PILImage.MAX_IMAGE_PIXELS = None
        PILImage.preinit()  # the common formats' plugins, before any thread opens a file
        self._pool = ThreadPoolExecutor(self._threads) if self._threads > 1 else None
        self.embedder = None  # --near_embedding: the function, a batch of images at a time
        if self._embedding is not None:
            self.embedder = Embedder(self._embedding)
            self.embedder.setup()

    def start_bundle(self):
        self._pending = collections.deque()  # (Candidate, source, Future), in order

    def process(self, c: Candidate):
        source = paths.full_source(self._root, c.source, c.key)
        if self._pool is None:
            yield from self.embedded(self._outcome(c, source, _now(self._inspect, source)))
            return
        # a bucket's client stays on this thread
        inspecting = _now if paths.is_url(source) else self._pool.submit
        self._pending.append((c, source, inspecting(self._inspect, source)))
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
        """The Image of ``c``, or its Reject (counted here: Beam's counters are the
        bundle's thread's); a bucket's small image carries its bytes (``carried``)."""
        try:
            found, data = inspected.result()
        except Rejected as r:
            return make_reject(c.key, source, r.reason, r.detail)
        image = self.image(c, found)
        return image if data is None else image._replace(data=carried(source, data))

    def image(self, c: Candidate, found: tuple) -> Image:
        """The Image of a candidate and what inspecting it found (counted)."""
        fmt, height, width, channels, near, size, content, crc32 = found
        self._read.inc()
        self._bytes.inc(size)
        self._progress.add()
        return Image(
            c.key,
            c.source,
            c.rel_path,
            c.label,
            c.split,
            c.group,
            fmt,
            height,
            width,
            channels,
            size,
            content,
            crc32,
            near,
        )

    def inspect_bytes(self, data: bytes) -> tuple:
        """What an image held in memory is (a record's image feature, a small file read
        whole): the same rules as for a file.

        Raises:
            Rejected: why it is no image evenshard writes.
        """
        size = len(data)
        self._check_size(size)
        if size and not data.startswith(MAGIC):
            raise Rejected("unsupported_format", "not an image Pillow can identify")
        return self._inspected(io.BytesIO(data), size)

    def read_whole(self, source: str) -> bytes:
        """A file's bytes, read whole as a file's inspection reads one (a record that
        names its image's file: Parquet's paths): a regular file no larger than
        ``--max_image_mb``, checked before a byte is read.

        Raises:
            Rejected: missing, unreadable or too_large.
        """
        try:
            size, data = _size_and_bytes(source)
            self._check_size(size)
            return _all_of(source, size, data)
        except Rejected:
            raise
        except (OSError, ValueError) as e:  # BeamIOError is an OSError
            raise open_error(e) from e

    def _check_size(self, size: int) -> None:
        if size > self._max_bytes:
            raise Rejected(
                "too_large", f"{size:,} bytes > --max_image_mb ({self._max_bytes:,} bytes)"
            )

    def _inspect(self, source: str) -> tuple[tuple, bytes | None]:
        """Type and size first, then the first bytes, then the body (full) or the header;
        what was found, and the file's bytes where it was read whole in one call.

        Nothing is read from a file that is not a regular file (a FIFO would
        block forever, a device never ends) or that is larger than
        ``--max_image_mb``. A file up to 1 MB is read whole in one call; a
        larger one's body is read only after its first bytes look like an
        image.
        """
        try:
            size, data = _size_and_bytes(source)
            self._check_size(size)
            if size <= _SMALL_FILE:
                # one read: Pillow's header parsers make ~40 small reads an
                # image, several times dearer on a file than in memory
                data = _all_of(source, size, data)
                return self.inspect_bytes(data), data
            with open_binary(source) as f:
                head = f.read(16)
                if not head.startswith(MAGIC):
                    raise Rejected("unsupported_format", "not an image Pillow can identify")
                if self._full or self._near:
                    return self._inspected(self._whole(head + f.read(size), size), size), None
                f.seek(0)
                return self._inspected(f, size), None  # the header only
        except Rejected:
            raise
        except (OSError, ValueError) as e:  # BeamIOError is an OSError
            raise open_error(e) from e

    @staticmethod
    def _whole(data: bytes, size: int) -> io.BytesIO:
        if len(data) != size:
            raise Rejected("unreadable", "the file changed size while it was read")
        return io.BytesIO(data)

    def _inspected(self, stream, size: int) -> tuple:
        found = inspect_stream(
            stream,
            size,
            full=self._full,
            max_pixels=self._max_pixels,
            near=self._near,
            pixels=self._embedding is not None,
        )
        return (*found, size, *self._digests(stream))

    def _digests(self, stream) -> tuple[str, int | None]:
        """(sha256 for ``--dedupe content``, else ""; CRC-32 of the file, None when only its
        header was read): from the bytes in memory, else the file read in 1 MB chunks
        (``--dedupe content`` reads it whole)."""
        if isinstance(stream, io.BytesIO):
            with stream.getbuffer() as data:
                return hashlib.sha256(data).hexdigest() if self._hash else "", zlib.crc32(data)
        if not self._hash:
            return "", None
        digest, crc32 = hashlib.sha256(), 0
        stream.seek(0)
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            crc32 = zlib.crc32(chunk, crc32)
        return digest.hexdigest(), crc32


# A bucket's images (files, or records' features) this small carry their bytes to the shard writer
# (``Image.data``) instead of the writer reading each again: there a read is a request
# (1.7 ms of the client's CPU on the loopback server, tens of ms of latency on a real
# bucket) for a few KB; one-example files of 2 KB JPEGs were two requests a record.
# What a worker process has carried is bounded (``CARRY_BUDGET``), so the local
# runner, which holds what travels in memory, holds at most that much a worker; past it,
# the writer reads again. Local files are read again as before (a read is a few µs).
CARRY_BYTES = 64 << 10
CARRY_BUDGET = 256 << 20
_carried_bytes = 0  # by this process


def carried(path: str, image: bytes) -> bytes | None:
    """``image`` when it is to travel with its record (``CARRY_BYTES``), else None."""
    global _carried_bytes
    if not paths.is_url(path) or len(image) > CARRY_BYTES:
        return None
    if _carried_bytes + len(image) > CARRY_BUDGET:
        return None
    _carried_bytes += len(image)
    return image


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


# Files up to this size (a typical photo or icon) are read whole in one call;
# larger ones have their first bytes checked before the body is read
# (--verify full), or only their header read (--verify header).
_SMALL_FILE = 1 << 20


def _size_and_bytes(source: str) -> tuple[int, bytes | None]:
    """The file's size, and its bytes when they came with it: an object of a bucket
    up to ``_SMALL_FILE`` is one ranged request for both (its size alone is one too)."""
    if stores.store(source):
        data = read_bytes(source, _SMALL_FILE + 1)
        if len(data) <= _SMALL_FILE:
            return len(data), data
        return storage.size(source), None
    return _regular_file_size(source), None


def _all_of(source: str, size: int, data: bytes | None) -> bytes:
    """The ``size`` bytes of a file (``data``, when they came with its size), in one read."""
    data = read_bytes(source, size + 1) if data is None else data
    if len(data) != size:
        raise Rejected("unreadable", "the file changed size while it was read")
    return data


def _regular_file_size(source: str) -> int:
    """The size of a regular file; a folder, FIFO, device or socket is ``unreadable``."""
    if paths.is_url(source):
        found = FileSystems.match([source])[0].metadata_list
        if not found:
            raise Rejected("missing", "file not found")
        return found[0].size_in_bytes
    st = os.stat(source)
    if stat.S_ISDIR(st.st_mode):
        raise Rejected("unreadable", "a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise Rejected("unreadable", "not a regular file (a FIFO, device or socket)")
    return st.st_size


class InspectImages(beam.PTransform):
    """Candidate -> {main: Image, rejects: Reject}.

    ``verify``: "full" decodes every image, "header" parses the header only;
    files over ``max_image_mb`` (10**6 bytes a MB) or images over
    ``max_image_pixels`` are ``too_large``; ``hash_content``: sha256 of each
    file (``--dedupe content``); ``near``: decode every image (as "full") and take
    its near-duplicate fingerprint (``--dedupe near``; ``embedding``: MODULE:FUNCTION,
    whose vector is the fingerprint instead, ``beam_jobs.near_embedding``). Relative
    ``Candidate.source`` values are under ``source_root``.
    """

    def __init__(
        self,
        verify: str,
        max_image_pixels: int,
        max_image_mb: float,
        source_root: str | None,
        hash_content: bool = False,
        near: bool = False,
        embedding: str | None = None,
    ):
        super().__init__()
        self._hash = hash_content
        self._near = near
        self._embedding = embedding
        self._verify = verify
        self._max_pixels = max_image_pixels
        self._root = source_root
        self._max_bytes = int(max_image_mb * 10**6)

    @property
    def arguments(self) -> tuple:
        """``InspectImage``'s arguments (a source that inspects as it reads makes its own)."""
        return (
            self._verify,
            self._max_pixels,
            self._root,
            self._max_bytes,
            self._hash,
            self._near,
            self._embedding,
        )

    def expand(self, candidates):
        # Candidate -> Image | Reject
        threads = local_threads(candidates.pipeline.options)
        inspect = InspectImage(*self.arguments, threads=threads)
        inspected = candidates | "Inspect" >> beam.ParDo(inspect)
        return inspected | "SplitRejects" >> SplitRejects()
