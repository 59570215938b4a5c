"""The Python route's pixels: an encoded image decoded as the readers decode it, cropped,
flipped and resized as ``make_dataset`` resizes, in numpy (libjpeg-turbo through
simplejpeg for colour JPEGs, Pillow for the rest, OpenCV's bilinear resize). The
preprocessing processes (``reader.routes.preprocess``) and the tf.data route's batch decode
(``reader.decode.tf_decode``) both go through here, so their pixels are one function's."""

from __future__ import annotations

import io

import numpy as np

from reader.decode.pydecode import eight_bit_png, trns


def decode(encoded: bytes, channels: int) -> np.ndarray:
    """The image's pixels, uint8 HWC with ``channels``, as the readers decode (no EXIF
    rotation, a GIF's first frame). A colour JPEG goes through libjpeg-turbo directly
    (simplejpeg, with the readers' accurate IDCT and fancy upsampling: the same pixels
    as Pillow, a third of its time), a PNG through libpng directly (``_png``); what
    they will not convert (CMYK, a colour PNG to gray) and every other format, through
    Pillow (a 16-bit PNG as its 8-bit high bytes)."""
    if channels in (3, 4) and encoded[:3] == b"\xff\xd8\xff":
        import simplejpeg

        try:
            return simplejpeg.decode_jpeg(
                encoded,
                colorspace="RGB" if channels == 3 else "RGBA",
                fastdct=False,
                fastupsample=False,
            )
        except ValueError:  # CMYK, or a JPEG libjpeg-turbo refuses: Pillow says why
            pass
    if encoded[:8] == b"\x89PNG\r\n\x1a\n":
        if len(encoded) > 25 and encoded[24] == 16 and trns(encoded) is not None:
            encoded = eight_bit_png(encoded)  # a 16-bit tRNS, as libpng applies it
        image = _png(encoded, channels)
        if image is not None:
            return image
    from PIL import Image

    encoded = eight_bit_png(encoded)  # 16-bit samples: their high bytes, as TensorFlow
    with Image.open(io.BytesIO(encoded)) as im:
        if im.format == "GIF":  # transparent pixels are black, as TensorFlow's decoder
            rgba = np.asarray(im.convert("RGBA"))
            rgb = np.where(rgba[..., 3:] == 0, 0, rgba[..., :3]).astype(np.uint8)
            im = Image.fromarray(rgb, "RGB")
        im = im.convert({1: "L", 3: "RGB", 4: "RGBA"}[channels])
        pixels = np.asarray(im)
    return pixels[..., None] if channels == 1 else pixels


def _png(encoded: bytes, channels: int) -> np.ndarray | None:
    """A PNG's pixels through libpng (OpenCV, the GIL released: a small PNG spent most
    of its time in Pillow's Python, one core for tf.data's parallel calls), equal to
    Pillow's in every colour type, bit depth (16 bits: the high byte, libpng's strip)
    and tRNS (tests/test_decoders.py); None where Pillow decides: a colour PNG to
    gray (Pillow's luma weights) and a PNG libpng refuses (Pillow says why)."""
    cv2 = cv2_module()
    image = cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        return None
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    if image.ndim == 2:  # gray (a gray+alpha PNG comes as BGRA)
        if channels == 1:
            return image[..., None]
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB if channels == 3 else cv2.COLOR_GRAY2RGBA)
    if channels == 1:
        return None
    if image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGR2RGBA)
    return cv2.cvtColor(image, cv2.COLOR_BGRA2RGB if channels == 3 else cv2.COLOR_BGRA2RGBA)


def crop_resize(image: np.ndarray, box, size) -> np.ndarray:
    """``image``'s crop ``box`` (top, left, height, width, flip), flipped when ``flip``,
    resized to ``size`` (a new array: views of one image do not share pixels)."""
    top, left, height, width, flip = (int(v) for v in box)
    out = image[top : top + height, left : left + width]  # a view: resized in place
    if size is not None and out.shape[:2] != tuple(size):
        out = resize(out, size)  # then flipped: the small array, not the crop
    if not flip:
        return np.ascontiguousarray(out)
    flipped = cv2_module().flip(out, 1)  # 1/25 of numpy's copy of a reversed view
    return flipped[..., None] if flipped.ndim == 2 else flipped


def resize(image: np.ndarray, size) -> np.ndarray:
    """Bilinear resize of ``image`` as every reader resizes (half-pixel centres, no
    antialiasing, as ``tf.image.resize`` and DALI's ``antialias=False``): OpenCV's
    ``INTER_LINEAR``, 11-bit fixed-point weights (within a level of the float
    resize), at 1/40 of the time of the same resize in numpy."""
    height, width = size
    if image.shape[:2] == (height, width):
        return image
    if image.strides[1:] != (image.shape[2] * image.itemsize, image.itemsize):
        image = np.ascontiguousarray(image)  # OpenCV takes a crop of rows and columns
    out = cv2_module().resize(image, (width, height), interpolation=cv2_module().INTER_LINEAR)
    return out[..., None] if out.ndim == 2 else out  # OpenCV drops a single channel


def cv2_module():
    """OpenCV, one thread a process (the processes are the parallelism)."""
    import cv2

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
    return cv2
