"""Near-duplicate fingerprints: a 64-bit perceptual hash of each image, the weak bits
left out of a distance, and the second measure that confirms a pair.

The fingerprint is the DCT hash (pHash, as ``imagehash.phash`` computes it):
the image in grayscale, resized to 32x32, its 8x8 lowest 2-D DCT frequencies,
each bit set where a coefficient is above their median. It changes little
when an image is resized, re-encoded, brightened or cut a little at an edge,
and two unrelated photos differ in about half the bits. Two images are near
duplicates when their fingerprints differ in at most ``distance`` bits
(``DEFAULT_DISTANCE``: chosen from the precision/recall curve in
benchmarks/RESULTS.md).

Before hashing, transparency is laid on mid gray (an icon's hidden pixels hold
any colour). The hash is only half the rule (issue 46): its median bits are
noise where many coefficients sit near the median (flat, symmetric drawings:
icons, gradients), so a candidate pair within ``distance`` bits is checked by a
second, independent measure before it counts (:func:`matches`): the 8x8 gray
thumbnails (each one's mean taken off) and the 2x2 colours must agree; and an
image too flat to trust (its *quality*, the mean step between neighbouring
pixels, below ``QUALITY_GATE``) matches only within ``FLAT_DISTANCE`` bits and
``FLAT_GRAY_APART`` levels, its brightness included, unless both thumbnails show a
shape (``FLAT_SHAPE``: a gentle gradient of a sky, not a plain square), whose
brightness may differ as a brightened copy's does. The fingerprint carries all
three: ``FINGERPRINT_CHARS`` hex digits.

Integer arithmetic throughout (Pillow's 8-bit resize, an integer DCT basis; the
products in float64, every value an integer under 2**38, so exact), so a
fingerprint is the same bits on every machine and runner.

The pairs are found at scale by ``schemas.near_pairs`` (bands of the bits).

Pillow and numpy only: no Beam, no TensorFlow.
"""

from __future__ import annotations

import functools
import json
import warnings
from typing import NamedTuple

import numpy as np

from schemas import layout
from schemas.errors import InvalidValueError

BITS = 64
SIZE = 32  # the grayscale image the DCT is taken of
LOW = 8  # the LOW x LOW lowest frequencies make the 64 bits
DEFAULT_DISTANCE = 10
MAX_DISTANCE = 20
AUDIT_DISTANCE = 14  # evenshard leaks: wider than convert's rule, to see what it missed
AUDIT_SLACK = 1.5  # ... and the thumbnails' thresholds half as wide again

THUMB = 8  # the gray thumbnail the second measure compares, THUMB x THUMB
WEAK = 8  # the hash's bits nearest the median, left out of a distance
WEAK_A_BAND = 2  # at most this many of them in a band (each one doubles its probes)
FINGERPRINT_CHARS = 16 + 16 + 2 + 2 * (THUMB * THUMB + 12)
BACKGROUND = (128, 128, 128, 255)  # transparency is laid on mid gray
QUALITY_GATE = 4  # a mean step below 1 gray level: too flat for its bits to mean much
FLAT_DISTANCE = 4  # ... such an image matches only within this many bits ...
FLAT_GRAY_APART = 3  # ... and thumbnails this close, their means left on (a flat
# picture's brightness is most of what it shows: a plain square of another gray is
# another picture) ...
FLAT_SHAPE = 6  # ... unless both thumbnails' grays lie this far from their mean (levels,
# on average): a shape, which a brighter copy keeps (their means then left off)
GRAY_APART = 12  # thumbnails further apart (gray levels, mean) are two pictures
COLOUR_APART = 16  # 2x2 colours further apart (levels, mean) are two pictures

WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def _dct_basis() -> np.ndarray:
    """The first LOW rows of the orthonormal DCT-II matrix of SIZE points, times 2**12,
    rounded: integers, so the transform is exact and the same everywhere."""
    n = np.arange(SIZE)
    k = np.arange(LOW)[:, None]
    basis = np.cos(np.pi * (2 * n + 1) * k / (2 * SIZE)) * np.sqrt(2 / SIZE)
    basis[0] /= np.sqrt(2)
    return np.round(basis * 4096).astype(np.int64)


_BASIS = _dct_basis()
# in float64 for BLAS: every product and partial sum is an integer under 2**38 (255 * 32
# * 1,023 * 32 * 1,023 at most), exact in a double, so the same integers as in int64
_BASIS_F, _BASIS_FT = _BASIS.astype(np.float64), np.ascontiguousarray(_BASIS.T, np.float64)
_CELLS = np.kron(np.eye(THUMB), np.ones(SIZE // THUMB))  # 8 x 32: the thumbnail's cells
_HALVES = np.kron(np.eye(2), np.ones(SIZE // 2))  # 2 x 32: the 2x2 colours' rows


def composited(image):
    """A Pillow image (any mode) -> RGB (an RGB image itself, not a copy), its
    transparency laid on ``BACKGROUND`` (an icon's transparent pixels hold any colour;
    what shows is the drawing)."""
    from PIL import Image

    if image.mode in WIDE_MODES:  # 16-bit and float: scaled to 8 bits first
        values = np.asarray(image.convert("F"), dtype=np.float64)
        top = float(values.max()) or 1.0
        image = Image.fromarray(np.clip(values * (255.0 / top), 0, 255).astype(np.uint8), "L")
    with warnings.catch_warnings():  # a palette's transparency as bytes: converted anyway
        warnings.simplefilter("ignore", UserWarning)
        if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
            image = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", image.size, BACKGROUND), image)
        return image if image.mode == "RGB" else image.convert("RGB")  # no copy of an RGB one


def fingerprint(image) -> str:
    """The fingerprint of a Pillow image (any mode; loaded): the 64-bit DCT hash (16
    hex digits), its weak bits (16), the quality (2), the 8x8 gray thumbnail and the
    2x2 colours (152): ``FINGERPRINT_CHARS`` hex digits, see :func:`parse`.

    After the resize, whole-image products in float64, every value an integer under
    2**38 (exact): the DCT, the thumbnail's and the colours' cell sums, the steps."""
    from PIL import Image

    image = composited(image)
    if max(image.size) > 4 * SIZE:  # a cheap box reduction first: less work
        image = image.reduce(max(1, min(image.size) // (2 * SIZE)))
    small = image.resize((SIZE, SIZE), Image.LANCZOS)
    gray = np.asarray(small.convert("L"), dtype=np.float64)
    low = (_BASIS_F @ gray @ _BASIS_FT).ravel()
    ranked = np.sort(low)
    twice = 2 * low - (ranked[BITS // 2 - 1] + ranked[BITS // 2])  # twice above the median
    margin = np.abs(twice)
    margin[0] = np.inf  # the DC's bit is in no band: never weak
    weak = np.zeros(BITS, dtype=bool)
    weak[np.argsort(margin, kind="stable")[:WEAK]] = True  # the bits closest to flipping
    steps = np.abs(np.diff(gray, axis=0)).sum() + np.abs(np.diff(gray, axis=1)).sum()
    quality = min(255, int(4 * steps) // (2 * SIZE * (SIZE - 1)))  # mean step, in 1/4 levels
    thumb = (_CELLS @ gray @ _CELLS.T) // ((SIZE // THUMB) ** 2)
    rgb = np.asarray(small, dtype=np.float64).reshape(SIZE, SIZE * 3)
    colour = (_HALVES @ rgb).reshape(2, 2, SIZE // 2, 3).sum(axis=2) // (SIZE * SIZE // 4)
    tail = bytes([quality]) + thumb.astype(np.uint8).tobytes() + colour.astype(np.uint8).tobytes()
    return np.packbits(np.concatenate([twice > 0, weak])).tobytes().hex() + tail.hex()


class Parsed(NamedTuple):
    value: int  # the 64-bit DCT hash
    weak: int  # its WEAK bits nearest the median: set either way by a small change
    quality: int  # the mean step between neighbouring pixels, in 1/4 gray levels
    thumb: np.ndarray  # 64 gray levels and 12 colour values (int16)


def parse(fp: str) -> Parsed:
    tail = bytes.fromhex(fp[32:])
    thumb = np.frombuffer(tail[1:], np.uint8).astype(np.int16)
    return Parsed(int(fp[:16], 16), int(fp[16:32], 16), tail[0], thumb)


def apart(a: Parsed, b: Parsed, distance: int) -> int:
    """The bits two hashes differ in, bits weak in either left out."""
    weak = weak_bits(a.weak, distance) | weak_bits(b.weak, distance)
    return ((a.value ^ b.value) & ~weak).bit_count()


def looks_alike(a: Parsed, b: Parsed, bits: int, slack: float = 1.0) -> int | None:
    """The second measure for one pair ``bits`` apart (:func:`thumbs_apart`); None: not
    alike."""
    found = thumbs_apart(
        a.thumb[None],
        b.thumb[None],
        np.array([a.quality]),
        np.array([b.quality]),
        np.array([bits]),
        slack,
    )[0]
    return None if found < 0 else int(found)


def thumbs_apart(ta, tb, qa, qb, bits, slack: float = 1.0) -> np.ndarray:
    """The second measure, for many pairs (row i of each array: pair i; ``bits``: the
    pair's hashes' bits apart, :func:`apart`): how far apart two thumbnails are (the
    mean gray difference, each thumbnail's own mean taken off first, so a brightened
    copy is close), in gray levels; -1 where they are too far apart (the gray, or the
    colours of two coloured images: a gray copy of a colour picture is the picture;
    ``slack`` times the thresholds). Where either image is below the quality gate, its
    weakest bits and its thumbnail's small differences mean little: the pair must be
    within ``FLAT_DISTANCE`` bits and ``FLAT_GRAY_APART`` levels, the means left on
    (or off, whichever is closer, where both thumbnails show a shape: :func:`shape`,
    ``FLAT_SHAPE``).

    In int16 (a difference of two levels and its mean: within +-510), the colours and
    the flat rule only for the pairs whose gray is alike."""
    ta, tb = np.asarray(ta, dtype=np.int16), np.asarray(tb, dtype=np.int16)  # exact: 0-255
    d = ta[:, :64] - tb[:, :64]
    mean = (d.sum(axis=1, dtype=np.int32) // 64).astype(np.int16)
    gray = np.abs(d - mean[:, None]).sum(axis=1, dtype=np.int32) // 64
    out = np.full(len(d), -1, dtype=np.int32)
    at = np.flatnonzero(gray <= GRAY_APART * slack)
    a, b = ta[at], tb[at]
    c = a[:, 64:] - b[:, 64:]
    shift = (c.sum(axis=1, dtype=np.int32) // 12).astype(np.int16)
    colour = np.abs(c - shift[:, None]).sum(axis=1, dtype=np.int32) // 12
    alike = ~((colour > COLOUR_APART * slack) & _coloured(a) & _coloured(b))
    flat = np.flatnonzero(np.minimum(np.asarray(qa)[at], np.asarray(qb)[at]) < QUALITY_GATE)
    close = np.ones(len(at), dtype=bool)  # the flat rule, for the flat pairs only
    level = np.abs(d[at[flat]]).sum(axis=1, dtype=np.int32) // 64  # the means left on
    shaped = np.minimum(shape(a[flat]), shape(b[flat])) >= FLAT_SHAPE
    level = np.where(shaped, np.minimum(level, gray[at[flat]]), level)
    close[flat] = (np.asarray(bits)[at[flat]] <= FLAT_DISTANCE * slack) & (
        level <= FLAT_GRAY_APART * slack
    )
    at = at[alike & close]
    out[at] = gray[at]
    return out


def shape(thumbs: np.ndarray) -> np.ndarray:
    """How far each gray thumbnail's levels lie from their mean, on average (whole
    levels, rounded down): 0 for a plain square, about a quarter of a gradient's span."""
    g = np.asarray(thumbs)[:, : THUMB * THUMB].astype(np.int32)
    cells = THUMB * THUMB
    return np.abs(g * cells - g.sum(axis=1, keepdims=True)).sum(axis=1) // (cells * cells)


def _coloured(thumbs: np.ndarray) -> np.ndarray:
    """Whether each thumbnail's 2x2 colours are coloured (a channel apart by over 2)."""
    cells = thumbs[:, 64:].reshape(len(thumbs), 4, 3)
    return (cells.max(axis=2) - cells.min(axis=2)).max(axis=1) > 2


def matches(a: Parsed, b: Parsed, distance: int, slack: float = 1.0) -> int | None:
    """The match rule: None, or the edge's weight (bits apart * 256 + thumbnail levels
    apart) when the hashes are within ``distance`` bits (:func:`apart`) and the
    thumbnails agree."""
    bits = apart(a, b, distance)
    if bits > distance:
        return None
    seen = looks_alike(a, b, bits, slack)
    return None if seen is None else edge_weight(bits, seen)


def edge_weight(bits, levels):
    """A matched pair's weight: its bits apart first, then its thumbnails' gray levels
    apart (ints or int arrays); the buckets' forest, the stars' nearest centre and
    :func:`matches` order pairs by it."""
    return bits * 256 + levels


def to_int(fp: str) -> int:
    """The 64-bit hash of a fingerprint."""
    return int(fp[:16], 16)


def as_array(fingerprints) -> np.ndarray:
    """Fingerprints -> their 64-bit hashes, a uint64 array."""
    return np.array([int(h[:16], 16) for h in fingerprints], dtype=np.uint64)


def band_bits(distance: int) -> list[list[int]]:
    """The bit positions of each of the ``distance + 1`` bands: bits 0..62 (the DC
    coefficient's bit, 63, left out) dealt in turn."""
    count = distance + 1
    return [list(range(i, BITS - 1, count)) for i in range(count)]


@functools.lru_cache(maxsize=1 << 16)
def weak_bits(weak: int, distance: int) -> int:
    """The weak bits that count at ``distance``: at most ``WEAK_A_BAND`` a band (its
    lowest), so an image is in at most 2**WEAK_A_BAND values of a band."""
    out = 0
    for band in weak_by_band(weak, distance):
        for bit in band:
            out |= bit
    return out


def weak_by_band(weak: int, distance: int) -> list[list[int]]:
    """Each band's weak bits that count (single-bit ints, in the 64-bit value, lowest
    first): band i holds bits i, i + bands, ... (:func:`band_bits`), so a bit's band is
    its position modulo the bands; the DC's bit (63) is in none."""
    count = distance + 1
    out: list[list[int]] = [[] for _ in range(count)]
    weak &= (1 << (BITS - 1)) - 1
    while weak:
        lowest = weak & -weak
        weak ^= lowest
        band = out[(lowest.bit_length() - 1) % count]
        if len(band) < WEAK_A_BAND:
            band.append(lowest)
    return out


def describe(found: dict) -> str:
    """One line of what ``--dedupe near`` found (dataset_info's ``near_duplicates``)."""
    kept = f", {found['rejected']} rejected" if found.get("keep") == "one" else ""
    given = found.get("given_two_splits", 0)
    across = f", {given} given two splits by the manifest" if given else ""
    largest = found.get("largest_cluster")
    biggest = f", the largest {largest}" if largest else ""
    cut = found.get("components_cut", 0)
    split = (
        f"; {cut} groups of matched pairs cut into several clusters (each image a "
        "near-duplicate of its cluster's centre: a chain of small steps is not one "
        "cluster; evenshard leaks shows the pairs across splits)"
        if cut
        else ""
    )
    rule = (
        f"cosine >= {found['threshold']:g} by {found['embedding']}"
        if "embedding" in found
        else f"within {found['distance']} bits"
    )
    return (
        f"near-duplicates ({rule}): {found['clusters']} cluster"
        f"{'' if found['clusters'] == 1 else 's'} "
        f"holding {found['inputs_in_clusters']} inputs{biggest}{kept}{across}{split}"
    )


def sidecar_name(shard_name: str) -> str:
    """The fingerprints of a shard, in record order: ``NAME.near`` beside it."""
    return shard_name + layout.NEAR_SUFFIX


def sidecar_line(key: str, hex_fingerprint: str) -> bytes:
    """One record's line of a shard's ``.near`` file: ``["<fingerprint>", "<key>"]``."""
    return (json.dumps([hex_fingerprint, key], ensure_ascii=True) + "\n").encode("ascii")


def sidecar_chars(found) -> int:
    """The hex digits of each fingerprint of a dataset's ``.near`` files (``found``: its
    dataset_info's ``near_duplicates``, None without): the hash's ``FINGERPRINT_CHARS``,
    or 0 for an embedding's vectors (any length, one a file)."""
    return 0 if "embedding" in (found or {}) else FINGERPRINT_CHARS


def parse_sidecar(data: bytes, chars: int = FINGERPRINT_CHARS) -> list[tuple[str, str]]:
    """(key, hex fingerprint) of each line of a ``.near`` file (``chars``: each one's hex
    digits; 0: an embedding's vectors, any even count, the same on every line);
    ValueError naming the first line that is not one."""
    out = []
    for number, line in enumerate(data.decode("ascii").splitlines(), 1):
        found = json.loads(line)
        if chars == 0 and out:
            chars = len(out[0][1])  # an embedding: every vector as long as the first
        if not (
            isinstance(found, list)
            and len(found) == 2
            and all(isinstance(x, str) for x in found)
            and (len(found[0]) == chars if chars else len(found[0]) % 2 == 0 < len(found[0]))
        ):
            digits = f"{chars} hex digits" if chars else "hex digits"
            raise InvalidValueError(f'line {number} is not ["<{digits}>", "<key>"]')
        bytes.fromhex(found[0])
        out.append((found[1], found[0]))
    return out
