"""Inspection: what each input is (the rules: ``schemas.images``; here, reading the files),
an Image or why it is a reject.

``verify="full"`` decodes every image, so truncated and corrupt files are
caught here rather than in the middle of a training run. ``verify="header"``
only parses the header for format and size, and takes the byte size from the
file system: much faster, and still catches most broken files.

An :class:`Inspector` inspects one file at a time (``inspect``, ``outcome``);
Beam's ``InspectImage`` (``beam_jobs.inspect_images``) runs it over workers, a few
files at a time in threads, counted in Beam's metrics.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import zlib
from collections.abc import Callable

from convert_core import paths
from convert_core.records import Candidate, Image, Reject, make_reject
from schemas import storage
from schemas.images import MAGIC, Rejected, inspect_stream

# Files up to this size (a typical photo or icon) are read whole in one call;
# larger ones have their first bytes checked before the body is read
# (--verify full), or only their header read (--verify header).
SMALL_FILE = 1 << 20


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


def image_of(c: Candidate, found: tuple) -> Image:
    """The Image of a candidate and what inspecting it found (``Inspector.inspect``)."""
    fmt, height, width, channels, near, size, content, crc32 = found
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


def outcome(c: Candidate, source: str, inspected: Callable[[], tuple]) -> Image | Reject:
    """The Image of ``c``, or its Reject: ``inspected()`` gives what inspecting its file
    ``source`` found (``Inspector.inspect``; a ``Rejected`` raised: why it is none); a
    bucket's small image carries its bytes (``carried``)."""
    try:
        found, data = inspected()
    except Rejected as r:
        return make_reject(c.key, source, r.reason, r.detail)
    image = image_of(c, found)
    return image if data is None else image._replace(data=carried(source, data))


class Inspector:
    """Files and bytes -> what they are, by the image rules and the job's limits.

    ``verify``: "full" decodes every image, "header" parses the header only;
    files over ``max_image_bytes`` or images over ``max_image_pixels`` are
    ``too_large``; ``hash_content``: sha256 of each file (``--dedupe content``);
    ``near``: decode every image (as "full") and take its near-duplicate fingerprint
    (``--dedupe near``); ``pixels``: keep the pixels (``--near_embedding``). Relative
    ``Candidate.source`` values are under ``source_root``; files are read through
    ``files``.
    """

    def __init__(
        self,
        verify: str,
        max_image_pixels: int,
        source_root: str | None,
        max_image_bytes: int,
        hash_content: bool = False,
        near: bool = False,
        pixels: bool = False,
    ):
        self.root = source_root
        self.hash_content = hash_content
        self._near = near
        self._pixels = pixels
        self._full = verify == "full"
        self._max_pixels = max_image_pixels
        self._max_bytes = max_image_bytes

    @classmethod
    def of(cls, job) -> Inspector:
        """The Inspector of a ``convert_core.job.Job``: its flags' limits, under its root."""
        o = job.options
        return cls(
            o.verify,
            o.max_image_pixels,
            job.input_root,
            int(o.max_image_mb * 10**6),  # 10**6 bytes a MB
            hash_content=o.dedupe == "content",
            near=o.dedupe == "near",
            pixels=o.near_embedding is not None,
        )

    @staticmethod
    def setup() -> None:
        """Pillow, once a process before any thread opens a file: our own pixel limit
        applies (``too_large``), not Pillow's global guard, which would raise before we
        can say why; the common formats' plugins loaded."""
        from PIL import Image as PILImage

        PILImage.MAX_IMAGE_PIXELS = None
        PILImage.preinit()

    def source(self, c: Candidate) -> str:
        """The file of a candidate."""
        return paths.full_source(self.root, c.source, c.key)

    def candidate(self, c: Candidate) -> Image | Reject:
        """A candidate inspected here: its Image, or its Reject."""
        source = self.source(c)
        return outcome(c, source, lambda: self.inspect(source))

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
            size, data = self._size_and_bytes(source)
            self._check_size(size)
            return self._all_of(source, size, data)
        except Rejected:
            raise
        except (OSError, ValueError) as e:
            raise open_error(e) from e

    def _check_size(self, size: int) -> None:
        if size > self._max_bytes:
            raise Rejected(
                "too_large", f"{size:,} bytes > --max_image_mb ({self._max_bytes:,} bytes)"
            )

    def inspect(self, source: str) -> tuple[tuple, bytes | None]:
        """Type and size first, then the first bytes, then the body (full) or the header;
        what was found, and the file's bytes where it was read whole in one call.

        Nothing is read from a file that is not a regular file (a FIFO would
        block forever, a device never ends) or that is larger than
        ``--max_image_mb``. A file up to 1 MB is read whole in one call; a
        larger one's body is read only after its first bytes look like an
        image.

        Raises:
            Rejected: why it is no image evenshard writes.
        """
        try:
            size, data = self._size_and_bytes(source)
            self._check_size(size)
            if size <= SMALL_FILE:
                # one read: Pillow's header parsers make ~40 small reads an
                # image, several times dearer on a file than in memory
                data = self._all_of(source, size, data)
                return self.inspect_bytes(data), data
            with storage.open_binary(source) as f:
                head = f.read(16)
                if not head.startswith(MAGIC):
                    raise Rejected("unsupported_format", "not an image Pillow can identify")
                if self._full or self._near:
                    return self._inspected(self._whole(head + f.read(size), size), size), None
                f.seek(0)
                return self._inspected(f, size), None  # the header only
        except Rejected:
            raise
        except (OSError, ValueError) as e:
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
            pixels=self._pixels,
        )
        return (*found, size, *self._digests(stream))

    def _digests(self, stream) -> tuple[str, int | None]:
        """(sha256 for ``--dedupe content``, else ""; CRC-32 of the file, None when only its
        header was read): from the bytes in memory, else the file read in 1 MB chunks
        (``--dedupe content`` reads it whole)."""
        if isinstance(stream, io.BytesIO):
            with stream.getbuffer() as data:
                return hashlib.sha256(data).hexdigest() if self.hash_content else "", zlib.crc32(
                    data
                )
        if not self.hash_content:
            return "", None
        digest, crc32 = hashlib.sha256(), 0
        stream.seek(0)
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            crc32 = zlib.crc32(chunk, crc32)
        return digest.hexdigest(), crc32

    def _size_and_bytes(self, source: str) -> tuple[int, bytes | None]:
        """The file's size, and its bytes when they came with it: an object of a bucket
        up to ``SMALL_FILE`` is one ranged request for both (its size alone is one too)."""
        if storage.store_of(source):
            data = storage.read_range(source, SMALL_FILE + 1)
            if len(data) <= SMALL_FILE:
                return len(data), data
            return storage.size(source), None
        return self._regular_file_size(source), None

    def _all_of(self, source: str, size: int, data: bytes | None) -> bytes:
        """The ``size`` bytes of a file (``data``, when they came with its size), in one read."""
        data = storage.read_range(source, size + 1) if data is None else data
        if len(data) != size:
            raise Rejected("unreadable", "the file changed size while it was read")
        return data

    def _regular_file_size(self, source: str) -> int:
        """The size of a regular file; a folder, FIFO, device or socket is ``unreadable``."""
        st = os.stat(source)
        if stat.S_ISDIR(st.st_mode):
            raise Rejected("unreadable", "a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise Rejected("unreadable", "not a regular file (a FIFO, device or socket)")
        return st.st_size


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
