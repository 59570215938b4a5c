"""Near-duplicate fingerprints: a 64-bit perceptual hash of each image, and its bands.

The fingerprint is the DCT hash (pHash, as ``imagehash.phash`` computes it):
the image in grayscale, resized to 32x32, its 8x8 lowest 2-D DCT frequencies,
each bit set where a coefficient is above their median. It changes little
when an image is resized, re-encoded, brightened or cut a little at an edge,
and two unrelated photos differ in about half the bits. Two images are near
duplicates when their fingerprints differ in at most ``distance`` bits
(``DEFAULT_DISTANCE``: chosen from the precision/recall curve in
benchmarks/RESULTS.md).

Integer arithmetic throughout (Pillow's 8-bit resize, an integer DCT basis),
so a fingerprint is the same bits on every machine and runner.

Finding pairs at scale: deal 63 of the bits into ``distance + 1`` bands; two
fingerprints within ``distance`` bits agree on at least one whole band (the
pigeonhole principle), so comparing only fingerprints that share a band value
finds every pair, and no step holds more than one band value's fingerprints.
The DC coefficient's bit is left out (it is set in nearly every image: a band
holding it would have half the values), and bits are dealt in turn (band i
takes bits i, i + bands, ...), so no band is one row of correlated
frequencies.

Pillow and numpy only: no Beam, no TensorFlow.
"""

from __future__ import annotations

import json
import warnings

import numpy as np

from schemas import layout

BITS = 64
SIZE = 32  # the grayscale image the DCT is taken of
LOW = 8  # the LOW x LOW lowest frequencies make the 64 bits
DEFAULT_DISTANCE = 10
MAX_DISTANCE = 20

_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def _dct_basis() -> np.ndarray:
    """The first LOW rows of the orthonormal DCT-II matrix of SIZE points, times 2**12,
    rounded: integers, so the transform is exact and the same everywhere."""
    n = np.arange(SIZE)
    k = np.arange(LOW)[:, None]
    basis = np.cos(np.pi * (2 * n + 1) * k / (2 * SIZE)) * np.sqrt(2 / SIZE)
    basis[0] /= np.sqrt(2)
    return np.round(basis * 4096).astype(np.int64)


_BASIS = _dct_basis()


def fingerprint(image) -> str:
    """The 64-bit DCT hash of a Pillow image (any mode; loaded), as 16 hex digits."""
    from PIL import Image

    if image.mode in _WIDE_MODES:  # 16-bit and float: scaled to 8 bits first
        values = np.asarray(image.convert("F"), dtype=np.float64)
        top = float(values.max()) or 1.0
        image = Image.fromarray(np.clip(values * (255.0 / top), 0, 255).astype(np.uint8), "L")
    with warnings.catch_warnings():  # a palette's transparency, which gray drops anyway
        warnings.simplefilter("ignore", UserWarning)
        image = image.convert("L")  # every mode (palette, 1-bit, CMYK, alpha) to gray first
    if max(image.size) > 4 * SIZE:  # a cheap box reduction first: less work
        image = image.reduce(max(1, min(image.size) // (2 * SIZE)))
    gray = np.asarray(image.resize((SIZE, SIZE), Image.LANCZOS), dtype=np.int64)
    low = (_BASIS @ gray @ _BASIS.T).ravel()
    ranked = np.sort(low)
    bits = 2 * low > ranked[BITS // 2 - 1] + ranked[BITS // 2]  # above the median
    return f"{int(np.packbits(bits).view('>u8')[0]):016x}"


def to_int(hex_fingerprint: str) -> int:
    return int(hex_fingerprint, 16)


def as_array(hex_fingerprints) -> np.ndarray:
    """Hex fingerprints -> uint64 array."""
    return np.array([int(h, 16) for h in hex_fingerprints], dtype=np.uint64)


def band_bits(distance: int) -> list[list[int]]:
    """The bit positions of each of the ``distance + 1`` bands: bits 0..62 (the DC
    coefficient's bit, 63, left out) dealt in turn."""
    count = distance + 1
    return [list(range(i, BITS - 1, count)) for i in range(count)]


def bands(value: int, distance: int) -> list[tuple[int, int]]:
    """(band, band value) of a fingerprint: two fingerprints within ``distance`` bits
    share at least one."""
    out = []
    for i, bits in enumerate(band_bits(distance)):
        out.append((i, sum(((value >> b) & 1) << k for k, b in enumerate(bits))))
    return out


def band_values(values: np.ndarray, distance: int) -> list[np.ndarray]:
    """:func:`bands` of a uint64 array: one array of band values a band."""
    out = []
    for bits in band_bits(distance):
        band = np.zeros(len(values), dtype=np.uint64)
        for k, b in enumerate(bits):
            band |= ((values >> np.uint64(b)) & np.uint64(1)) << np.uint64(k)
        out.append(band)
    return out


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between every fingerprint of ``a`` and every one of ``b`` (uint64
    arrays): a len(a) x len(b) array."""
    return np.bitwise_count(a[:, None] ^ b[None, :]).astype(np.int8)


PAIRS_A_BLOCK = 1 << 22  # pairs compared at once: about 40 MB of temporaries


def close_pairs(values: np.ndarray, distance: int):
    """(i, j, bits) for every i < j with fingerprints within ``distance`` bits, compared
    a block of rows at a time (``PAIRS_A_BLOCK`` pairs: memory bounded whatever the
    count)."""
    block = max(1, PAIRS_A_BLOCK // max(1, len(values)))
    for start in range(0, len(values), block):
        d = distances(values[start : start + block], values)
        rows, cols = np.nonzero(d <= distance)
        keep = cols > rows + start
        for i, j in zip(rows[keep], cols[keep]):
            yield start + int(i), int(j), int(d[i, j])


def describe(found: dict) -> str:
    """One line of what ``--dedupe near`` found (dataset_info's ``near_duplicates``)."""
    kept = f", {found['rejected']} rejected" if found.get("keep") == "one" else ""
    given = found.get("given_two_splits", 0)
    across = f", {given} given two splits by the manifest" if given else ""
    largest = found.get("largest_cluster")
    biggest = f", the largest {largest}" if largest else ""
    return (
        f"near-duplicates (within {found['distance']} bits): {found['clusters']} clusters "
        f"holding {found['inputs_in_clusters']} inputs{biggest}{kept}{across}"
    )


def sidecar_name(shard_name: str) -> str:
    """The fingerprints of a shard, in record order: ``NAME.near`` beside it."""
    return shard_name + layout.NEAR_SUFFIX


def sidecar_line(key: str, hex_fingerprint: str) -> bytes:
    """One record's line of a shard's ``.near`` file: ``["<16 hex>", "<key>"]``."""
    return (json.dumps([hex_fingerprint, key], ensure_ascii=True) + "\n").encode("ascii")


def parse_sidecar(data: bytes) -> list[tuple[str, str]]:
    """(key, hex fingerprint) of each line of a ``.near`` file; ValueError naming the
    first line that is not one."""
    out = []
    for number, line in enumerate(data.decode("ascii").splitlines(), 1):
        found = json.loads(line)
        if not (
            isinstance(found, list)
            and len(found) == 2
            and all(isinstance(x, str) for x in found)
            and len(found[0]) == 16
        ):
            raise ValueError(f'line {number} is not ["<16 hex digits>", "<key>"]')
        int(found[0], 16)
        out.append((found[1], found[0]))
    return out
