"""The image rules: which files are images evenshard takes, and what they decode to.

One table of the formats (their Pillow names, file extensions, and which
readers decode them), and the checks convert runs on every input and
``validate --full`` runs on every record: Pillow opens it, the readers'
decoders must read it faithfully, and the channel count is the one the
readers' decoder gives. Pillow (and simplejpeg for JPEGs that decode cleanly): no
Beam, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import io
import warnings
import zlib

from schemas.errors import Error


@dataclasses.dataclass(frozen=True)
class ImageFormat:
    """One format: its ``image/format`` value, Pillow's names for it, its file
    extensions (the first is what generated images get), and whether DALI decodes it."""

    name: str
    pillow: tuple[str, ...]
    extensions: tuple[str, ...]
    dali: bool


# MPO is the multi-picture JPEG that many cameras write; its first picture is a plain JPEG.
FORMATS = (
    ImageFormat("jpeg", ("JPEG", "MPO"), (".jpg", ".jpeg"), dali=True),
    ImageFormat("png", ("PNG",), (".png",), dali=True),
    ImageFormat("gif", ("GIF",), (".gif",), dali=False),  # nvImageCodec reads no GIF
    ImageFormat("bmp", ("BMP",), (".bmp",), dali=True),
    ImageFormat("webp", ("WEBP",), (".webp",), dali=True),
)
# Pillow format name -> the value of image/format
PILLOW_FORMATS = {p: f.name for f in FORMATS for p in f.pillow}
IMAGE_EXTENSIONS = tuple(e for f in FORMATS for e in f.extensions)
EXTENSION = {f.name: f.extensions[0] for f in FORMATS}
DALI_FORMATS = tuple(f.name for f in FORMATS if f.dali)
MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"RIFF")


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


# --near_embedding: a JPEG is decoded at the smallest DCT scale that keeps this many
# px a side (where the image has them): enough for a model's 224 or 256 px input
EMBEDDING_SIDE = 256
NEAR_SIDE = 64  # ... and for the fingerprint (schemas.near: 32 x 32, after a reduction to 64 px)


class Rejected(Error):
    """An image convert rejects: the reject ``reason`` and a one-line ``detail``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def inspect_stream(
    f, size: int, *, full: bool, max_pixels: int, near: bool = False, pixels: bool = False
):
    """Returns (format, height, width, channels, fingerprint) of the image in ``f``, or
    raises Rejected.

    Args:
        f: a seekable binary stream positioned at 0.
        size: the file's size in bytes.
        full: decode all pixels (catches truncation), not just the header.
        max_pixels: larger images are rejected as too_large before decoding.
        near: decode (as ``full`` does) and give the image's near-duplicate
            fingerprint (``schemas.near``), else "".
        pixels: with ``near``, give the decoded image instead of the fingerprint (an
            RGB uint8 array, H x W x 3, transparency laid on mid gray: what the hash
            is taken of), which ``--near_embedding``'s function is given; a JPEG is
            decoded at the DCT scale that keeps ``EMBEDDING_SIDE`` px a side.
    """
    from PIL import Image as PILImage

    if size == 0:
        raise Rejected("empty", "file has zero bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = PILImage.open(f)
    except PILImage.UnidentifiedImageError:
        f.seek(0)
        if f.read(8).startswith(MAGIC):
            raise Rejected("corrupt", "image header found, but Pillow cannot parse it") from None
        raise Rejected("unsupported_format", "not an image Pillow can identify") from None
    except Exception as e:  # noqa: BLE001 - Pillow plugins raise many types on bad input
        raise _classify_decode_error(e) from e
    fmt = PILLOW_FORMATS.get(im.format or "")
    if fmt is None:
        raise Rejected("unsupported_format", f"format {im.format} is not supported")
    width, height = im.size
    if width * height > max_pixels:
        raise Rejected("too_large", f"{width}x{height} = {width * height} pixels > {max_pixels}")
    if width < 1 or height < 1:
        raise Rejected("corrupt", f"image has size {width}x{height}")
    bmp_bits = _check_reader_can_decode(fmt, im, f)
    fingerprint = ""
    if full or near:
        decoded = None  # --dedupe near: a clean JPEG decoded by libjpeg-turbo at the draft size
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # a JPEG libjpeg-turbo decodes cleanly: Pillow's decode would pass too
                clean = fmt == "jpeg" and not near and _decodes_cleanly(f)
                if fmt == "jpeg" and not clean:
                    # libjpeg's DCT scaling: every block is still entropy-decoded
                    # (a cut or garbled body still fails), the inverse DCT runs
                    # at 1/8 size: a third less time on 64 px, more on photos
                    # (a fingerprint wants 64 px a side where the image has them)
                    side = EMBEDDING_SIDE if pixels else NEAR_SIDE
                    least = (min(width, side), min(height, side)) if near else (1, 1)
                    im.draft(None, (max(least[0], width // 8), max(least[1], height // 8)))
                    decoded = _decoded_cleanly_at_draft(f, im) if near else None
                if not clean and decoded is None:
                    im.load()
        except Exception as e:  # noqa: BLE001 - as above; the reason is recorded
            raise _classify_decode_error(e) from e
        if fmt == "png":
            f.seek(0)
            _check_png_crcs(f.read())
        if near and pixels:
            import numpy as np

            from schemas.near import composited

            fingerprint = np.asarray(composited(im if decoded is None else decoded))
        elif near:
            from schemas.near import fingerprint as near_fingerprint

            fingerprint = near_fingerprint(im if decoded is None else decoded)
    return fmt, height, width, decoded_channels(fmt, im, f, bmp_bits), fingerprint


def _decodes_cleanly(f) -> bool:
    """Whether libjpeg-turbo decodes the JPEG in ``f`` (a BytesIO; any other stream:
    False) without a single warning: then Pillow's decode of it passes too, and is
    skipped.

    simplejpeg's strict decode at 1/8 scale, gray out (every block of every
    component is still entropy-decoded; the inverse DCT and colour work shrink to
    nothing): 0.23 ms a photo against 0.30 for Pillow's draft decode. Pillow has
    opened the file first, so its header checks, facts and reject reasons stand;
    a clean decode is one Pillow's passes (the same library, without the warnings
    Pillow lets pass), and anything else takes Pillow's decode and its verdict.
    """
    found = _clean_jpeg(f, colorspace="GRAY", min_height=1, min_width=1, min_factor=8)
    return found is not None


def _decoded_cleanly_at_draft(f, im):
    """A JPEG's pixels at the size Pillow's ``draft`` set on ``im`` (an RGB or gray JPEG
    in a BytesIO), decoded by libjpeg-turbo when it decodes cleanly, as a Pillow image;
    None: Pillow decodes it (and gives its verdict).

    The same library at the same DCT scale, its slow integer IDCT and fancy upsampling
    (both libraries' defaults): the same pixels as Pillow's decode (1,300 crops and
    photos alike, byte for byte; tests/test_near.py), in 108 us against Pillow's 250
    on 64-128 px crops. It is also the strict decode ``_decodes_cleanly`` checks.
    """
    if im.mode not in ("RGB", "L"):
        return None  # CMYK and YCCK: Pillow's conversion
    from PIL import Image as PILImage

    width, height = im.size
    colorspace = "RGB" if im.mode == "RGB" else "GRAY"
    pixels = _clean_jpeg(f, colorspace=colorspace, min_width=width, min_height=height)
    if pixels is None or pixels.shape[:2] != (height, width):  # a scale Pillow did not choose
        return None
    return PILImage.fromarray(pixels if im.mode == "RGB" else pixels[:, :, 0])


def _clean_jpeg(f, **scale):
    """simplejpeg's strict decode of the JPEG in ``f`` (a BytesIO), ``scale`` its
    colour space and size; None where ``f`` is another stream or the decode warns or
    fails."""
    if not isinstance(f, io.BytesIO):
        return None
    import simplejpeg

    with f.getbuffer() as data:
        try:
            return simplejpeg.decode_jpeg(data, strict=True, **scale)
        except (ValueError, RuntimeError):
            return None


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
            raise Rejected(
                "unsupported_format",
                f"BMP of {bits} bits per pixel, compression {compression}: the reader decodes "
                "uncompressed 24- and 32-bit BMP only; convert the file to PNG",
            )
    if fmt == "webp" and getattr(im, "is_animated", False):
        raise Rejected(
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
            raise Rejected("corrupt", f"PNG chunk {name} fails its CRC (the reader refuses it)")
        if kind == b"IEND":
            return
        pos = end + 4


def _classify_decode_error(e: Exception) -> Rejected:
    message = str(e)
    if "truncated" in message.lower():
        return Rejected("truncated", message)
    if "DecompressionBomb" in type(e).__name__:
        return Rejected("too_large", message)
    return Rejected("corrupt", f"{type(e).__name__}: {message}")
