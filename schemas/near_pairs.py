"""Finding the near-duplicate pairs of many fingerprints (``schemas.near``) at scale.

Finding pairs at scale: deal 63 of the bits into ``distance + 1`` bands; two
fingerprints within ``distance`` bits agree on at least one whole band (the
pigeonhole principle), so comparing only fingerprints that share a band value
finds every pair, and no step holds more than one band value's fingerprints.
The DC coefficient's bit is left out (it is set in nearly every image: a band
holding it would have half the values), and bits are dealt in turn (band i
takes bits i, i + bands, ...), so no band is one row of correlated
frequencies.

A band value's fingerprints are compared in arrays (:func:`close_pairs`: a block of
rows at a time, memory bounded whatever the count), the thumbnails of the pairs within
the distance after them (``near.thumbs_apart``); :class:`HashRule` is the interface
the pipeline's steps use (``near_embedding.EmbeddingRule`` is the other).

Numpy only: no Beam, no TensorFlow.
"""

from __future__ import annotations

import functools

import numpy as np

from schemas.near import (
    BITS,
    FINGERPRINT_CHARS,
    MAX_DISTANCE,
    WEAK_A_BAND,
    Parsed,
    band_bits,
    edge_weight,
    thumbs_apart,
    weak_by_band,
)


def bands(fp: Parsed, distance: int) -> list[tuple[int, int]]:
    """(band, band value) of a fingerprint, every setting of its weak bits: two whose
    hashes are within ``distance`` bits, weak bits left out (:func:`apart`), share at
    least one. A band's value and weak bits are gathered a byte at a time
    (:func:`_band_tables`); its weak bits that count are its lowest ``WEAK_A_BAND``
    (:func:`weak_bits`), each setting's bit n that of the n-th of them."""
    value, count = fp.value.to_bytes(8, "little"), distance + 1
    out = []
    weak_bands = weak_by_band(fp.weak, distance)
    for i, (table, weak) in enumerate(zip(_band_tables(distance), weak_bands)):
        base = 0
        for j in range(8):
            base |= table[j][value[j]]
        loose = [1 << ((bit.bit_length() - 1) // count) for bit in weak]  # bit k: band's k-th
        for setting in range(1 << len(loose)):
            v = base
            for n, bit in enumerate(loose):
                v = v | bit if setting >> n & 1 else v & ~bit
            out.append((i, v))
    return out


@functools.lru_cache(maxsize=MAX_DISTANCE + 1)
def _band_tables(distance: int) -> list[list[list[int]]]:
    """For each band (:func:`band_bits`), for each byte j of a 64-bit value (bits 8j to
    8j + 7), for each value of that byte: the band's bits it sets (bit k: the band's k-th
    bit)."""
    out = []
    for bits in band_bits(distance):
        table = [[0] * 256 for _ in range(8)]
        for k, b in enumerate(bits):
            for byte in range(256):
                if byte >> (b % 8) & 1:
                    table[b // 8][byte] |= 1 << k
        out.append(table)
    return out


def candidate_pairs(fps: list[Parsed], distance: int):
    """(i, j) for every i < j within ``distance`` bits (:func:`apart`), sorted: one band at
    a time, the fingerprints sharing a band value (:func:`bands`) compared, in arrays (a
    band's values, an int64 each times its weak bits' settings; no Python object a
    value). The peak is the comparisons' blocks (``close_pairs``) and the pairs found:
    400,000 fingerprints of 100,000 pictures, 676 MB against 629 for a dict of buckets,
    at 0.72 times its CPU."""
    n = len(fps)
    values = np.array([fp.value for fp in fps], dtype=np.uint64)
    weak = weak_bits_many(np.array([fp.weak for fp in fps], dtype=np.uint64), distance)
    pairs = np.zeros(0, np.int64)  # i * n + j
    for bits in band_bits(distance):
        found = [pairs]
        for _, members in shared_values(*_band_settings(values, weak, bits)):
            rows, cols, _ = close_pairs(values[members], distance, weak[members])
            found.append(members[rows] * n + members[cols])
        pairs = np.unique(np.concatenate(found))  # a band's found, joined: few objects held
    return list(zip((pairs // max(n, 1)).tolist(), (pairs % max(n, 1)).tolist()))


def shared_values(value: np.ndarray, owner: np.ndarray):
    """(band value, its owners ascending) of each value of a band two or more owners have
    (``value``, ``owner``: one entry a fingerprint's value, :func:`_band_settings`)."""
    order = np.lexsort((owner, value))
    value, owner = value[order], owner[order]
    starts = np.flatnonzero(np.r_[True, value[1:] != value[:-1]])
    ends = np.r_[starts[1:], len(value)]
    shared = ends - starts > 1
    for start, end in zip(starts[shared].tolist(), ends[shared].tolist()):
        yield int(value[start]), owner[start:end]


def _band_settings(values: np.ndarray, weak: np.ndarray, bits: list[int]):
    """(band value, owner) arrays of one band: every fingerprint's value of the band under
    every setting of its weak bits in it (:func:`bands`, for arrays)."""
    base = np.zeros(len(values), dtype=np.int64)
    loose = np.full((WEAK_A_BAND, len(values)), -1, dtype=np.int64)  # each one's k, in order
    count = np.zeros(len(values), dtype=np.int64)
    for k, b in enumerate(bits):
        base |= ((values >> np.uint64(b)) & np.uint64(1)).astype(np.int64) << k
        here = ((weak >> np.uint64(b)) & np.uint64(1)).astype(bool) & (count < WEAK_A_BAND)
        loose[count[here], np.flatnonzero(here)] = k
        count += here
    out_band, out_owner = [], []
    for setting in range(1 << WEAK_A_BAND):
        takes = setting < (1 << count)  # the settings of the weak bits it has
        value = base[takes]
        for n_, ks in enumerate(loose[:, takes]):
            has = ks >= 0
            bit = np.int64((setting >> n_) & 1)
            shift = np.where(has, ks, 0)
            value = np.where(has, (value & ~(np.int64(1) << shift)) | (bit << shift), value)
        out_band.append(value)
        out_owner.append(np.flatnonzero(takes))
    return np.concatenate(out_band), np.concatenate(out_owner)


def share_a_band(a: np.ndarray, b: np.ndarray, weak: np.ndarray, distance: int, below: int):
    """Whether each pair of hashes (uint64 arrays; ``weak``: the bits weak in either,
    :func:`weak_bits`) shares a value (:func:`bands`) of one of the bands before band
    ``below``: agrees on each of that band's bits weak in neither."""
    differ = (a ^ b) & ~weak
    out = np.zeros(len(a), dtype=bool)
    for bits in band_bits(distance)[:below]:
        mask = np.uint64(sum(1 << bit for bit in bits))
        out |= (differ & mask) == 0
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


def distances(a: np.ndarray, b: np.ndarray, wa=None, wb=None) -> np.ndarray:
    """Bits that differ between every fingerprint of ``a`` and every one of ``b`` (uint64
    arrays; ``wa``, ``wb``: their weak bits, left out): a len(a) x len(b) uint8 array."""
    differ = a[:, None] ^ b[None, :]
    if wa is not None:  # in place: one temporary of 8 bytes a pair, not three
        differ &= ~wa[:, None]
        differ &= ~wb[None, :]
    return np.bitwise_count(differ)


PAIRS_A_BLOCK = 1 << 22  # pairs compared at once: about 40 MB of temporaries
ROWS_A_BLOCK = 256  # ... in blocks of at most this many rows (each against those after)
THUMB_PAIRS = 1 << 14  # pairs whose thumbnails are compared at once: about 8 MB a temporary


def close_pairs(values: np.ndarray, distance: int, weak: np.ndarray | None = None):
    """(i, j, bits) arrays of every i < j with fingerprints within ``distance`` bits
    (``weak``: each one's weak bits, left out), a block of rows against the rows after
    it at a time (``PAIRS_A_BLOCK`` pairs: memory bounded whatever the count)."""
    n = len(values)
    block = max(1, min(ROWS_A_BLOCK, PAIRS_A_BLOCK // max(1, n)))
    found = [(np.zeros(0, np.int64),) * 3]
    for start in range(0, n, block):
        stop = min(n, start + block)
        rows_weak = cols_weak = None
        if weak is not None:
            rows_weak, cols_weak = weak[start:stop], weak[start:]
        d = distances(values[start:stop], values[start:], rows_weak, cols_weak).ravel()
        at = np.flatnonzero(d <= distance)  # half the time of a 2-D nonzero
        rows, cols = np.divmod(at, n - start)
        keep = cols > rows  # both counted from ``start``: the pairs after the diagonal
        rows, cols, at = rows[keep], cols[keep], at[keep]
        found.append((rows + start, cols + start, d[at].astype(np.int64)))
    return tuple(np.concatenate(parts) for parts in zip(*found))


def match_grid(rows, cols, values, weak, quality, thumbs, distance: int) -> np.ndarray:
    """:func:`matches` for every pair of ``rows`` x ``cols`` (index arrays into
    :func:`parse_many`'s arrays, whose fingerprints are sorted as their hex sorts: a
    pair's thumbnails are compared lower index first, as the buckets and the audit
    compare them) -> a len(rows) x len(cols) bool array; an index matches itself.
    Memory bounded whatever the counts: the hashes ``PAIRS_A_BLOCK`` pairs at a time,
    the thumbnails of those within ``distance`` bits ``THUMB_PAIRS`` at a time."""
    rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    out = np.zeros((len(rows), len(cols)), dtype=bool)
    block = max(1, PAIRS_A_BLOCK // max(1, len(cols)))
    for start in range(0, len(rows), block):
        r = rows[start : start + block]
        bits = distances(values[r], values[cols], weak[r], weak[cols])
        close_i, close_j = np.nonzero(bits <= distance)
        for at in range(0, len(close_i), THUMB_PAIRS):
            i, j = close_i[at : at + THUMB_PAIRS], close_j[at : at + THUMB_PAIRS]
            lo, hi = np.minimum(r[i], cols[j]), np.maximum(r[i], cols[j])
            seen = thumbs_apart(thumbs[lo], thumbs[hi], quality[lo], quality[hi], bits[i, j])
            out[start + i, j] = (seen >= 0) | (lo == hi)
    return out


def parse_many(fps: list[bytes] | bytes, distance: int):
    """:func:`parse` of many fingerprints at once (each ``bytes.fromhex`` of one, or all
    of them joined) ->
    (hashes, their weak bits at ``distance`` (:func:`weak_bits`), qualities,
    thumbnails: one row each)."""
    raw = np.frombuffer(fps if isinstance(fps, bytes) else b"".join(fps), np.uint8)
    raw = raw.reshape(-1, FINGERPRINT_CHARS // 2)
    values = raw[:, :8].copy().view(">u8").ravel().astype(np.uint64)
    weak = weak_bits_many(raw[:, 8:16].copy().view(">u8").ravel().astype(np.uint64), distance)
    thumbs = raw[:, 17:].astype(np.int16)
    return values, weak, raw[:, 16].astype(np.int64), thumbs


def weak_bits_many(weak: np.ndarray, distance: int) -> np.ndarray:
    """:func:`weak_bits` of a uint64 array: each band's lowest ``WEAK_A_BAND`` weak bits."""
    weak = weak & np.uint64((1 << (BITS - 1)) - 1)  # the DC's bit is in no band
    out = np.zeros_like(weak)
    one = np.uint64(1)
    for bits in band_bits(distance):
        left = weak & np.uint64(sum(1 << b for b in bits))
        for _ in range(WEAK_A_BAND):
            lowest = left & (~left + one)  # two's complement: the lowest bit set (0: none)
            out |= lowest
            left ^= lowest
    return out


class HashRule:
    """Convert's pair rule for the perceptual hash (:func:`matches`), as the pipeline's
    steps use it (``near_duplicates``, ``near_stars``; ``near_embedding.EmbeddingRule``
    is the other): a fingerprint's bands, and the pairs of many at once."""

    def __init__(self, distance: int):
        self.distance = distance

    def bands_of(self, raw: bytes) -> list[tuple[int, int]]:
        """(band, band value) of one fingerprint (its bytes), :func:`bands`."""
        hashed = Parsed(int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"), 0, None)
        return bands(hashed, self.distance)

    def parse_many(self, fps: list[bytes]):
        return parse_many(fps, self.distance)

    def buckets(self, parsed, part: int, parts: int):
        """(band, band value, its owners ascending) of every band value two or more of
        ``parsed``'s fingerprints share (:func:`bands`: each weak bit's settings), those
        of one ``part`` of ``parts``: the buckets, in memory. A part takes whole bands
        (each band's values computed once: bands ``part``, ``part + parts``, ... where
        ``parts`` is under the bands), or a share of one band's values (``parts`` over
        the bands a band; the parts past a multiple of the bands take none)."""
        every = band_bits(self.distance)
        shares = max(1, parts // len(every))
        first, share = divmod(part, shares)
        for band in range(first, len(every), parts if shares == 1 else len(every)):
            value, owner = _band_settings(parsed[0], parsed[1], every[band])
            mine = value % shares == share
            for found, owners in shared_values(value[mine], owner[mine]):
                yield band, found, owners

    def bucket_pairs(self, parsed, band: int):
        """(i, j, weight) arrays of the pairs of one band value's distinct fingerprints
        (``parsed``, sorted as their hex sorts) that match and share no value of an
        earlier band (a pair is confirmed in its first band only); weight: bits apart *
        256 + thumbnail levels apart."""
        values, weak, quality, thumbs = parsed
        i, j, bits = close_pairs(values, self.distance, weak)
        later = ~share_a_band(values[i], values[j], weak[i] | weak[j], self.distance, band)
        i, j, bits = i[later], j[later], bits[later]
        if not len(i):
            return i, j, bits
        # the second measure, for all of the bucket's candidates at once
        apart = thumbs_apart(thumbs[i], thumbs[j], quality[i], quality[j], bits)
        took = apart >= 0
        return i[took], j[took], edge_weight(bits[took], apart[took])

    def grid(self, rows, cols, parsed) -> np.ndarray:
        """:func:`match_grid` of ``rows`` x ``cols``."""
        return match_grid(rows, cols, *parsed, self.distance)

    def pair_weights(self, a, b, parsed) -> np.ndarray:
        """The weights of matching pairs (a[k], b[k]) (index arrays into ``parsed``): bits
        apart * 256 + thumbnail levels apart, as :func:`near.matches` weighs them."""
        values, weak, quality, thumbs = parsed
        lo, hi = np.minimum(a, b), np.maximum(a, b)  # the thumbnails lower index first
        bits = np.bitwise_count((values[lo] ^ values[hi]) & ~(weak[lo] | weak[hi]))
        seen = thumbs_apart(thumbs[lo], thumbs[hi], quality[lo], quality[hi], bits)
        return edge_weight(bits.astype(np.int64), seen)
