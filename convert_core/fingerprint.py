"""Keyed 63-bit fingerprints: the only source of randomness in evenshard.

Every random choice (split bucket, shuffle order, stratification jitter) is a
function of ``(seed, purpose, key)``. Nothing depends on ``random`` state,
bundle order, worker count or runner, so the same inputs and options give
byte-identical shards everywhere.
"""

from __future__ import annotations

import hashlib

BITS = 63
_SCALE = float(1 << BITS)


def fp(seed: int, purpose: str, key: str) -> int:
    """Returns a 63-bit fingerprint of ``key`` salted by ``seed`` and ``purpose``.

    63 rather than 64 bits: Beam encodes ints as signed 64-bit (VarIntCoder),
    and a runner that infers an int coder would overflow on a uint64.
    """
    # surrogateescape keeps undecodable file names hashable; they are rejected
    # later as bad_path, but hashing must never crash on them.
    data = f"{seed}\x00{purpose}\x00{key}".encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def unit(seed: int, purpose: str, key: str) -> float:
    """Returns a float in [0, 1) derived from :func:`fp`."""
    return fp(seed, purpose, key) / _SCALE
