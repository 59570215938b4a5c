"""InspectImages: open every input with Pillow and record what it is.

``verify="full"`` decodes every image, so truncated and corrupt files are
caught here rather than in the middle of a training run. ``verify="header"``
only parses the header for format and size, and takes the byte size from the
file system: much faster, and still catches most broken files.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import warnings
import zlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs import paths
from beam_jobs.dead_letters import SplitRejects
from beam_jobs.paths import open_binary, read_bytes
from beam_jobs.progress import Progress
from beam_jobs.records import Candidate, Image, make_reject

# Pillow format name -> the value of image/format. MPO is the multi-picture
# JPEG that many cameras write; its first picture is a plain JPEG.
SUPPORTED_FORMATS = {
    "JPEG": "jpeg",
    "MPO": "jpeg",
    "PNG": "png",
    "GIF": "gif",
    "BMP": "bmp",
    "WEBP": "webp",
}
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"RIFF")

# Channels a decoder yields with channels=0, by Pillow mode. Palette images
# decode to RGB, or RGBA when they carry transparency (handled below).
_CHANNELS = {
    "1": 1,
    "L": 1,
    "I": 1,
    "I;16": 1,
    "I;16B": 1,
    "F": 1,
    "LA": 2,
    "La": 2,
    "P": 3,
    "RGB": 3,
    "YCbCr": 3,
    "LAB": 3,
    "HSV": 3,
    "RGBA": 4,
    "RGBa": 4,
    "CMYK": 3,  # decoders turn CMYK JPEGs into RGB
    "PA": 4,
}


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _open_error(e: Exception) -> _Rejected:
    """Maps a failure to open or read a file to missing / unreadable."""
    cause = e
    # BeamIOError wraps the real OSError in exception_details.
    details = getattr(e, "exception_details", None)
    if isinstance(details, dict) and details:
        cause = next(iter(details.values()))
    if isinstance(cause, FileNotFoundError) or getattr(cause, "errno", None) == errno.ENOENT:
        return _Rejected("missing", "file not found")
    if getattr(cause, "errno", None) == errno.ELOOP:
        return _Rejected("unreadable", "symlink loop")
    return _Rejected("unreadable", f"{type(cause).__name__}: {cause}")


def inspect_stream(f, size: int, *, full: bool, max_pixels: int):
    """Returns (format, height, width, channels) of the image in ``f``, or raises _Rejected.

    Args:
        f: a seekable binary stream positioned at 0.
        size: the file's size in bytes.
        full: decode all pixels (catches truncation), not just the header.
        max_pixels: larger images are rejected as too_large before decoding.
    """
    from PIL import Image as PILImage

    if size == 0:
        raise _Rejected("empty", "file has zero bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = PILImage.open(f)
    except PILImage.UnidentifiedImageError:
        f.seek(0)
        if f.read(8).startswith(_MAGIC):
            raise _Rejected("corrupt", "image header found, but Pillow cannot parse it") from None
        raise _Rejected("unsupported_format", "not an image Pillow can identify") from None
    except Exception as e:  # noqa: BLE001 - Pillow plugins raise many types on bad input
        raise _classify_decode_error(e) from e
    fmt = SUPPORTED_FORMATS.get(im.format or "")
    if fmt is None:
        raise _Rejected("unsupported_format", f"format {im.format} is not supported")
    width, height = im.size
    if width * height > max_pixels:
        raise _Rejected("too_large", f"{width}x{height} = {width * height} pixels > {max_pixels}")
    if width < 1 or height < 1:
        raise _Rejected("corrupt", f"image has size {width}x{height}")
    bmp_bits = _check_reader_can_decode(fmt, im, f)
    if full:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if fmt == "jpeg":
                    # libjpeg's DCT scaling: every block is still entropy-decoded
                    # (a cut or garbled body still fails), the inverse DCT runs
                    # at 1/8 size: a third less time on 64 px, more on photos
                    im.draft(None, (max(1, width // 8), max(1, height // 8)))
                im.load()
        except Exception as e:  # noqa: BLE001 - as above; the reason is recorded
            raise _classify_decode_error(e) from e
        if fmt == "png":
            f.seek(0)
            _check_png_crcs(f.read())
    return fmt, height, width, decoded_channels(fmt, im, f, bmp_bits)


# PNG colour type (IHDR byte 9) -> channels libpng gives: gray, RGB, palette
# (4 with a tRNS chunk), gray+alpha, RGBA; at every bit depth.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


def decoded_channels(fmt: str, im, f, bmp_bits: int | None) -> int:
    """The channels the readers' decoder (TensorFlow's, ``channels=0``) gives.

    Pillow's mode is not it: Pillow opens a 16-bit gray+alpha PNG as RGBA
    (libpng: 2 channels) and a GIF with a transparent colour as P with
    transparency (TensorFlow's GIF decoder: always RGB). So PNG goes by its
    colour type, GIF is 3, a 32-bit BMP 4, and the rest by Pillow's mode.
    """
    if fmt == "png":
        color_type = _png_color_type(f)
        if color_type is not None:
            channels = _PNG_CHANNELS[color_type]
            return 4 if color_type == 3 and "transparency" in im.info else channels
    if fmt == "gif":
        return 3
    if bmp_bits == 32:
        return 4
    channels = _CHANNELS.get(im.mode, 3)
    if im.mode == "P" and "transparency" in im.info:
        channels = 4
    return channels


def _png_color_type(f) -> int | None:
    """The colour type in the IHDR of the PNG in stream ``f``, else None."""
    try:
        f.seek(25)
        color_type = f.read(1)[0]
    except (OSError, ValueError, IndexError):
        return None
    return color_type if color_type in _PNG_CHANNELS else None


def _check_reader_can_decode(fmt: str, im, f) -> int | None:
    """Rejects what Pillow reads but the reader's decoder (TensorFlow) cannot read faithfully.

    - BMP: TensorFlow reads uncompressed 24- and 32-bit BMP only; 1-bit
      fails, and 8-bit (palette or gray) comes out as wrong pixels.
    - Animated WebP: TensorFlow's WebP decoder reads still images only.

    Returns:
        A BMP's bits per pixel (32-bit BMP decodes to 4 channels in
        TensorFlow, where Pillow shows 3), else None.
    """
    if fmt == "bmp":
        f.seek(0)
        head = f.read(34)
        dib = int.from_bytes(head[14:18], "little")
        if dib == 12:  # BITMAPCOREHEADER
            bits, compression = int.from_bytes(head[24:26], "little"), 0
        else:
            bits = int.from_bytes(head[28:30], "little")
            compression = int.from_bytes(head[30:34], "little")
        if bits not in (24, 32) or compression != 0:
            raise _Rejected(
                "unsupported_format",
                f"BMP of {bits} bits per pixel, compression {compression}: the reader decodes "
                "uncompressed 24- and 32-bit BMP only; convert the file to PNG",
            )
    if fmt == "webp" and getattr(im, "is_animated", False):
        raise _Rejected(
            "unsupported_format",
            "animated WebP: the reader decodes still WebP only; use its first frame, or GIF",
        )
    return bits if fmt == "bmp" else None


def _check_png_crcs(data: bytes) -> None:
    """Every PNG chunk's CRC, as libpng (the reader's decoder) checks them; Pillow does not."""
    pos = 8
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 8 + length
        if end + 4 > len(data):
            return  # cut short: the decode above has said so, or it ends in padding
        if zlib.crc32(data[pos + 4 : end]) != int.from_bytes(data[end : end + 4], "big"):
            name = kind.decode("latin-1")
            raise _Rejected("corrupt", f"PNG chunk {name} fails its CRC (the reader refuses it)")
        if kind == b"IEND":
            return
        pos = end + 4


def _classify_decode_error(e: Exception) -> _Rejected:
    message = str(e)
    if "truncated" in message.lower():
        return _Rejected("truncated", message)
    if "DecompressionBomb" in type(e).__name__:
        return _Rejected("too_large", message)
    return _Rejected("corrupt", f"{type(e).__name__}: {message}")


class _InspectImage(beam.DoFn):
    """Candidate -> Image, or a Reject (see dead_letters.py)."""

    def __init__(
        self,
        verify: str,
        max_image_pixels: int,
        source_root: str | None,
        max_image_bytes: int,
        hash_content: bool = False,
    ):
        self._root = source_root
        self._hash = hash_content
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

    def process(self, c: Candidate):
        try:
            fmt, height, width, channels, size, content = self._inspect(
                paths.full_source(self._root, c.source, c.key)
            )
        except _Rejected as r:
            Metrics.counter("evenshard", f"rejected_{r.reason}").inc()
            yield make_reject(
                c.key, paths.full_source(self._root, c.source, c.key), r.reason, r.detail
            )
            return
        self._read.inc()
        self._bytes.inc(size)
        self._progress.add()
        yield Image(
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
        )

    def _inspect(self, source: str):
        """Type and size first, then the first bytes, then the body (full) or the header.

        Nothing is read from a file that is not a regular file (a FIFO would
        block forever, a device never ends) or that is larger than
        ``--max_image_mb``. A file up to 1 MB is read whole in one call; a
        larger one's body is read only after its first bytes look like an
        image.
        """
        try:
            size = _regular_file_size(source)
            if size > self._max_bytes:
                raise _Rejected(
                    "too_large", f"{size:,} bytes > --max_image_mb ({self._max_bytes:,} bytes)"
                )
            if size <= _SMALL_FILE:
                # one read: Pillow's header parsers make ~40 small reads an
                # image, several times dearer on a file than in memory
                data = read_bytes(source, size + 1)
                if size and not data.startswith(_MAGIC):
                    raise _Rejected("unsupported_format", "not an image Pillow can identify")
                return self._inspected(self._whole(data, size), size)
            with open_binary(source) as f:
                head = f.read(16)
                if not head.startswith(_MAGIC):
                    raise _Rejected("unsupported_format", "not an image Pillow can identify")
                if self._full:
                    return self._inspected(self._whole(head + f.read(size), size), size)
                f.seek(0)
                return self._inspected(f, size)  # the header only
        except _Rejected:
            raise
        except (OSError, ValueError) as e:  # BeamIOError is an OSError
            raise _open_error(e) from e

    @staticmethod
    def _whole(data: bytes, size: int) -> io.BytesIO:
        if len(data) != size:
            raise _Rejected("unreadable", "the file changed size while it was read")
        return io.BytesIO(data)

    def _inspected(self, stream, size: int) -> tuple:
        found = inspect_stream(stream, size, full=self._full, max_pixels=self._max_pixels)
        return (*found, size, self._content_hash(stream) if self._hash else "")

    @staticmethod
    def _content_hash(stream) -> str:
        """sha256 of the whole file (``--dedupe content``), read in 1 MB chunks."""
        digest = hashlib.sha256()
        stream.seek(0)
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
        return digest.hexdigest()


# Files up to this size (a typical photo or icon) are read whole in one call;
# larger ones have their first bytes checked before the body is read
# (--verify full), or only their header read (--verify header).
_SMALL_FILE = 1 << 20


def _regular_file_size(source: str) -> int:
    """The size of a regular file; a folder, FIFO, device or socket is ``unreadable``."""
    if paths.is_url(source):
        found = FileSystems.match([source])[0].metadata_list
        if not found:
            raise _Rejected("missing", "file not found")
        return found[0].size_in_bytes
    st = os.stat(source)
    if stat.S_ISDIR(st.st_mode):
        raise _Rejected("unreadable", "a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise _Rejected("unreadable", "not a regular file (a FIFO, device or socket)")
    return st.st_size


class InspectImages(beam.PTransform):
    """Candidate -> {main: Image, rejects: Reject}.

    ``source_root``: the root that relative ``Candidate.source`` values are
    under (``sources.input_root``); None when sources are full paths.
    """

    def __init__(
        self,
        verify: str = "full",
        max_image_pixels: int = 178_956_970,
        source_root: str | None = None,
        max_image_bytes: int = 256 * 10**6,
        hash_content: bool = False,
    ):
        super().__init__()
        self._hash = hash_content
        self._verify = verify
        self._max_pixels = max_image_pixels
        self._root = source_root
        self._max_bytes = max_image_bytes

    def expand(self, candidates):
        # Candidate -> Image | Reject
        inspected = candidates | "Inspect" >> beam.ParDo(
            _InspectImage(self._verify, self._max_pixels, self._root, self._max_bytes, self._hash)
        )
        return inspected | "SplitRejects" >> SplitRejects()
