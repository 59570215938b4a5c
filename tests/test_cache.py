"""The bounded cache of a bucket's shards (reader/cache.py) against a hostile folder or
dataset_info.json, dead readers and a full disk (issue 27). Shards here are random bytes
in a loopback bucket: the cache reads bytes, not records."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

from reader.cache import CacheOptions, ShardCache
from schemas.info import DatasetError

pytestmark = pytest.mark.slow


def _shards(bucket, n: int = 4, size: int = 3000, prefix: str = "ds") -> list[dict]:
    """``n`` shards of random bytes put in the bucket, listed as the reader lists them."""
    rng = random.Random(n * size)
    shards = []
    for i in range(n):
        data = rng.randbytes(size)
        name = f"train-{i:05d}-of-{n:05d}.tfrecord"
        bucket.put(f"{prefix}/{name}", data)
        digest = hashlib.sha256(data).hexdigest()
        shards.append(
            {"path": f"{bucket.url}/{prefix}/{name}", "num_bytes": size, "sha256": digest}
        )
    return shards


@pytest.mark.parametrize("key", ["../victim/x", "/tmp/x", 7, "AB" * 32])
def test_a_sha256_that_is_not_a_digest_cannot_name_a_path(key, tmp_path):
    """Defence in depth under schemas.info: the cache itself refuses a sha256 that would
    name a file outside its folder, when it is built, before any file is made."""
    (tmp_path / "victim").mkdir()
    shards = [{"path": "gs://b/d/train-00000-of-00001.tfrecord", "num_bytes": 9, "sha256": key}]
    with pytest.raises(DatasetError, match="sha256 .* is not 64 lowercase hex digits"):
        ShardCache(shards, lambda: iter([(0,)]), CacheOptions(str(tmp_path / "c"), 100))
    assert os.listdir(tmp_path / "victim") == []
