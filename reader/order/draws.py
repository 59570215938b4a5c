"""Seeded draws: the one source of the read order's randomness, the same on any machine.

Every random choice of the order is a splitmix64 hash of (seed, purpose, ...) and an
index: no ``numpy.random`` (whose streams may change between numpy versions), no
process state. Each purpose has its number here, once, so no two draw the same values.
"""

from __future__ import annotations

import hashlib

import numpy as np

# purposes of the draws: where a number is used, it is one of these
RUNS = 1  # the order of an epoch's runs (reader.order.plan)
WINDOW = 2  # the permutation of a window of records (reader.order.plan)
CUTS = 3  # where each file is cut into runs (reader.order.plan)
MIX = 4  # each source's offset in a mixing schedule (reader.order.mix)
AUGMENT = 5  # an example's transform rng (reader.routes.preprocess)
CROP = 6  # an example's built-in crop box and flip (reader.order.augment)
ORDER = 7  # an epoch's permutation of a worker's records read by place (reader.order.plan)

_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def draws(n: int, *key: int) -> np.ndarray:
    """``n`` seeded uint64 values, the same for the same key on any machine."""
    return rows(n, *key)[0]


def permutation(n: int, *key: int) -> np.ndarray:
    """A seeded permutation of ``range(n)``: the same for the same key on any machine.

    Sorting hashed indices (not ``numpy.random``, whose streams may change
    between numpy versions) keeps the order stable across installs.
    """
    return np.argsort(draws(n, *key), kind="stable").astype(np.int64)


def rows(n: int, *key) -> np.ndarray:
    """``draws(n, *key)`` for many keys at once: parts of ``key`` are ints or arrays of
    one length m; row i of the (m, n) result is ``draws(n, *(part[i] ...))``."""
    h = np.zeros(1, np.uint64)
    for part in key:
        part = np.asarray(part, dtype=np.int64).astype(np.uint64) if np.ndim(part) else part
        h = _mix(h ^ (part if np.ndim(part) else np.uint64(int(part) & _MASK64)))
    return _mix(np.arange(n, dtype=np.uint64)[None, :] ^ h[:, None])


def key_digest(key: str | bytes) -> int:
    """An example key as a 63-bit int for the draws: the same on every machine."""
    data = key.encode() if isinstance(key, str) else bytes(key)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def uniform(values: np.ndarray) -> np.ndarray:
    """uint64 draws as floats in [0, 1), 53 bits each."""
    return (values >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
