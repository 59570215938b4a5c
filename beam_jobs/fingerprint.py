"""Keyed 64-bit fingerprints: the only source of randomness in evenshard.

Every random choice (split bucket, shuffle order, stratification jitter) is a
function of ``(seed, purpose, key)``. Nothing depends on ``random`` state,
bundle order, worker count or runner, so the same inputs and options give
byte-identical shards everywhere.
"""

from __future__ import annotations

import hashlib

_TWO_64 = float(1 << 64)


def fp(seed: int, purpose: str, key: str) -> int:
    """Returns a uint64 fingerprint of ``key`` salted by ``seed`` and ``purpose``."""
    # surrogateescape keeps undecodable file names hashable; they are rejected
    # later as bad_path, but hashing must never crash on them.
    data = f"{seed}\x00{purpose}\x00{key}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def unit(seed: int, purpose: str, key: str) -> float:
    """Returns a float in [0, 1) derived from :func:`fp`."""
    return fp(seed, purpose, key) / _TWO_64
