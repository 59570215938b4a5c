"""Near-duplicates by the user's own embedding (``--near_embedding MODULE:FUNCTION``):
its vectors, the cosine rule, and the bands that find the candidate pairs.

The function maps a decoded image (RGB, H x W x 3 uint8: the decode the perceptual
hash uses, transparency laid on mid gray) to a 1-D float vector; two images are
near-duplicates when their vectors' cosine similarity is at least the threshold
(``--near_threshold``). A function with ``batched = True`` is called with a list of
images and gives one vector a row (``batch_size``, default ``BATCH_SIZE``, at most
at once).

The stored vector (the image's fingerprint, carried through the pipeline and
written to the shard's ``.near`` file) is the function's vector quantised to int8,
scaled so its largest component is 127: half the bytes of float16, and the cosine
it gives is within 0.001 of the float vector's (measured on 20,000 pairs of 512-d
vectors at cosines 0.90-0.95: largest error 0.00096, mean 0.00017; int16: 4e-6 at
twice the bytes). The rule is applied to the stored vectors, by convert and by
``evenshard leaks`` alike, in float64: every product and partial sum is an integer
below 2**53, so the dot products are exact whatever the order the sum is taken in
(BLAS, block sizes, machine): the same pairs on every runner.

Finding pairs at scale: random-hyperplane signatures (SimHash). Each vector's sign
against hyperplanes fixed by a hash (SHAKE-256 of the dimension: int8 entries,
so the signs are exact too), ``BAND_BITS`` signs a band. Two vectors at angle
theta differ in a sign with probability theta / pi, so a pair at the threshold
shares a whole band with probability (1 - theta / pi) ** BAND_BITS, and one of
``bands_for(threshold)`` bands (chosen so a pair at the threshold is missed with
probability at most ``MISS``; a closer pair, less) nearly always. Only the vectors
that share a band value are compared: a band value holds about 1 / 4,096 of
vectors in unrelated directions (a real model's vectors share a component, and
share bands far more: docs/convert.md). Unlike the hash's bands this is probabilistic (a pair at the
threshold is missed once in 10,000; at 0.02 above it, about never), but fixed: the
same hyperplanes, the same misses, in convert and in the audit, whose wider
threshold takes more bands (a superset of convert's).

Numpy only: no Beam.
"""

from __future__ import annotations

import hashlib
import importlib
import math

import numpy as np

from schemas.errors import InvalidValueError

DEFAULT_THRESHOLD = 0.95
AUDIT_MARGIN = 0.05  # evenshard leaks: the threshold this much lower, to see what convert missed
BAND_BITS = 12  # signs a band: a band value holds ~1 / 4,096 of vectors in unrelated directions
MAX_BANDS = 64  # ... and at most this many bands (768 hyperplanes)
MISS = 1e-4  # a pair at the threshold shares no band with at most this probability
BATCH_SIZE = 32  # images a batched function is given at once, unless it says
LEVELS = 127  # the stored vector: int8, its largest component +-LEVELS
WEIGHT_SCALE = 1 << 20  # an edge's weight: (1 - cosine) in these units, an integer
PAIRS_A_BLOCK = 1 << 21  # cosines computed at once: 16 MB of float64
ROWS_A_BLOCK = 256  # ... in blocks of at most this many rows


def load(spec: str):
    """The function ``MODULE:FUNCTION`` names, imported; InvalidValueError (one line:
    what was expected, what was found) when it cannot be."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise InvalidValueError(
            f"--near_embedding {spec}: expected MODULE:FUNCTION (e.g. mypkg.embed:clip), "
            "a function from an RGB image array to a 1-D vector"
        )
    try:
        found = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import error is the user's to fix
        raise InvalidValueError(
            f"--near_embedding {spec}: module {module} cannot be imported "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); install it, or "
            "put its folder on PYTHONPATH for the launcher and the workers"
        ) from None
    fn = getattr(found, name, None)
    if fn is None:
        raise InvalidValueError(
            f"--near_embedding {spec}: module {module} has no attribute {name}; name a "
            "function of it"
        )
    if not callable(fn):
        kind = type(fn).__name__
        article = "an" if kind[:1] in "aeiou" else "a"
        raise InvalidValueError(
            f"--near_embedding {spec} is not callable ({article} {kind}); name a function"
        )
    return fn


def quantised(vector, spec: str, key: str) -> np.ndarray:
    """The function's output for one image -> the stored vector (int8, largest component
    +-127); InvalidValueError naming the image when it is not a 1-D finite vector that
    is not all zeros."""
    try:
        v = np.asarray(vector, dtype=np.float64)
    except (TypeError, ValueError):
        v = None
    if v is None or v.ndim != 1 or not len(v) or not np.isfinite(v).all():
        shape = "no array" if v is None else f"shape {v.shape}"
        finite = "" if v is None or np.isfinite(v).all() else ", not all finite"
        raise InvalidValueError(
            f"--near_embedding {spec} gave {shape}{finite} for {key}: it must return a "
            "1-D vector of finite floats, the same length for every image"
        )
    top = np.abs(v).max()
    if top == 0:
        raise InvalidValueError(
            f"--near_embedding {spec} gave all zeros for {key}: a vector with no direction "
            "has no cosine"
        )
    return np.round(v * (LEVELS / top)).astype(np.int8)


def parse_many(fps: list[bytes]) -> np.ndarray:
    """Stored vectors (each ``bytes.fromhex`` of one) -> one float64 row each (integers:
    exact products); InvalidValueError when their lengths differ."""
    sizes = {len(fp) for fp in fps}
    if len(sizes) > 1:
        raise InvalidValueError(
            f"--near_embedding gave vectors of {len(sizes)} lengths ({sorted(sizes)[:4]}): "
            "it must give every image a vector of the same length"
        )
    return np.frombuffer(b"".join(fps), np.int8).reshape(len(fps), -1).astype(np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with each row of ``b`` (parse_many's rows):
    exact dot products, then one correctly rounded sqrt and division each."""
    return (a @ b.T) / (_norms(a)[:, None] * _norms(b))


def _norms(rows: np.ndarray) -> np.ndarray:
    """Each row's length: an exact sum of squares, one correctly rounded sqrt."""
    return np.sqrt(np.einsum("ij,ij->i", rows, rows))


def bands_for(threshold: float) -> int:
    """Bands enough that a pair at ``threshold`` shares none with at most ``MISS``
    probability (at most ``MAX_BANDS``)."""
    theta = math.acos(max(-1.0, min(1.0, threshold)))
    hit = (1 - theta / math.pi) ** BAND_BITS
    if hit >= 1:
        return 1
    if hit <= 0:  # no pair is sure to share a sign (vectors all alike, centred: ~0)
        return MAX_BANDS
    return max(1, min(MAX_BANDS, math.ceil(math.log(MISS) / math.log(1 - hit))))


_PLANES: dict[int, np.ndarray] = {}


def _planes(dimension: int) -> np.ndarray:
    """The MAX_BANDS x BAND_BITS hyperplanes of a dimension, one column each (int8
    entries from SHAKE-256: the same everywhere), as float64."""
    found = _PLANES.get(dimension)
    if found is None:
        count = MAX_BANDS * BAND_BITS
        seed = b"evenshard near embedding %d" % dimension
        raw = hashlib.shake_256(seed).digest(count * dimension)
        found = np.frombuffer(raw, np.int8).reshape(dimension, count).astype(np.float64)
        _PLANES[dimension] = found
    return found


def centre_of(total, count: int, squares: int) -> dict:
    """The run's centre from the sum of its stored vectors, their count and the sum of
    their squared norms: ``vector``, each component's mean rounded half up, and
    ``shared``, the share of a vector's squared norm its mean holds (|mean|^2 over the
    mean |v|^2: 0 for unrelated directions, 0.5-0.6 for a model's vectors). Integers to
    the last division, so the same on every runner and worker count (sums of integers do
    not depend on their order)."""
    total = np.asarray(total, np.int64)
    vector = ((2 * total + count) // (2 * count)).tolist()
    norm = sum(int(t) * int(t) for t in total.tolist())
    return {"vector": vector, "shared": norm / (count * squares) if squares else 0.0}


def centred_threshold(threshold: float, shared: float) -> float:
    """The cosine, taken from the centre, of a typical pair at ``threshold``: the
    centre holds ``shared`` of each vector's squared norm, and a pair's difference is
    left whole (1 - cos' = (1 - cos) / (1 - shared)). The bands are sized for it."""
    return max(-1.0, 1 - (1 - threshold) / max(1 - shared, 1e-9))


def band_values(vectors: np.ndarray, bands: int, centre=None) -> np.ndarray:
    """(rows, bands) int64: each vector's value of each of the first ``bands`` bands (its
    BAND_BITS signs against that band's hyperplanes, a 1 for a positive dot product),
    taken from ``centre`` (the run's mean vector, ``centre_of``) when given.

    Why the centre: a model's vectors share a component (unrelated images sit near
    cosine 0.5), so their signs against hyperplanes through the origin agree far more
    than those of unrelated directions, and the bands compared a large share of all
    pairs (a shared component plus noise: 17.5 %); from the mean, what tells images
    apart decides the signs. Integers throughout, so the signs are exact everywhere.
    A pair's cosine from the centre is lower than from the origin: the bands are sized
    for it (``centred_threshold``)."""
    if centre is not None:
        vectors = vectors - np.asarray(centre["vector"], np.float64)
    signs = (vectors @ _planes(vectors.shape[1])[:, : bands * BAND_BITS]) > 0
    weights = 1 << np.arange(BAND_BITS, dtype=np.int64)
    return (signs.reshape(len(vectors), bands, BAND_BITS) * weights).sum(axis=2)


def candidate_pairs(vectors: np.ndarray, bands: int, centre=None) -> list[tuple[int, int]]:
    """(i, j), i < j, of the rows that share a value of one of the first ``bands`` bands
    (from ``centre``, as convert took them), in memory (the audit's search)."""
    values = band_values(vectors, bands, centre)
    found = set()
    for band in range(bands):
        order = np.lexsort((np.arange(len(vectors)), values[:, band]))
        column = values[order, band]
        starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
        for start, stop in zip(starts, np.r_[starts[1:], len(order)]):
            members = order[start:stop].tolist()
            found.update((a, b) for n, a in enumerate(members) for b in members[n + 1 :])
    return sorted((min(p), max(p)) for p in found)


class EmbeddingRule:
    """Convert's rule for the stored vectors (the interface of ``near_pairs.HashRule``): two
    images match when their cosine is at least ``threshold``."""

    def __init__(self, threshold: float, centre: dict | None = None):
        self.threshold = threshold
        self.centre = centre  # the run's centre (``centre_of``), or None
        shared = centre["shared"] if centre else 0.0
        self.bands = bands_for(centred_threshold(threshold, shared))

    def centred(self, centre: dict | None) -> EmbeddingRule:
        """This rule with its bands taken from ``centre``."""
        return EmbeddingRule(self.threshold, centre)

    def bands_of(self, raw: bytes) -> list[tuple[int, int]]:
        """(band, band value) of one stored vector."""
        row = band_values(parse_many([raw]), self.bands, self.centre)[0]
        return list(enumerate(row.tolist()))

    parse_many = staticmethod(parse_many)

    def bucket_pairs(self, vectors: np.ndarray, band: int):
        """(i, j, weight) arrays of the rows of one band value's distinct vectors that
        match and share no value of an earlier band (a pair is confirmed in its first
        band only); weight: (1 - cosine) * ``WEIGHT_SCALE``, rounded down."""
        n = len(vectors)
        block = max(1, min(ROWS_A_BLOCK, PAIRS_A_BLOCK // max(1, n)))
        found = [(np.zeros(0, np.int64),) * 2 + (np.zeros(0),)]
        for start in range(0, n, block):  # memory: a block of rows against those after
            c = cosines(vectors[start : start + block], vectors[start:])
            i, j = np.nonzero(np.triu(c >= self.threshold, 1))
            found.append((i + start, j + start, c[i, j]))
        i, j, c = (np.concatenate(parts) for parts in zip(*found))
        if band and len(i):
            values = band_values(vectors, band, self.centre)
            earlier = (values[i] == values[j]).any(axis=1)
            i, j, c = i[~earlier], j[~earlier], c[~earlier]
        return i, j, self.weights(c)

    @staticmethod
    def weights(c: np.ndarray) -> np.ndarray:
        return np.floor((1 - np.minimum(c, 1.0)) * WEIGHT_SCALE).astype(np.int64)

    def pair_weights(self, a, b, vectors: np.ndarray) -> np.ndarray:
        """The weights of pairs (a[k], b[k]) (row indices), as ``bucket_pairs`` weighs
        them: exact dot products, one sqrt and division each, as :func:`cosines`."""
        va, vb = vectors[a], vectors[b]
        return self.weights(np.einsum("ij,ij->i", va, vb) / (_norms(va) * _norms(vb)))

    def grid(self, rows, cols, vectors: np.ndarray) -> np.ndarray:
        """Whether each of ``rows`` x ``cols`` matches (an index matches itself)."""
        rows, cols = np.asarray(rows), np.asarray(cols)
        out = np.zeros((len(rows), len(cols)), dtype=bool)
        block = max(1, PAIRS_A_BLOCK // max(1, len(cols)))
        for start in range(0, len(rows), block):  # memory: PAIRS_A_BLOCK cosines at once
            r = rows[start : start + block]
            out[start : start + block] = cosines(vectors[r], vectors[cols]) >= self.threshold
        out |= rows[:, None] == cols[None, :]
        return out
