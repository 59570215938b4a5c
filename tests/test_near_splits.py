"""convert --dedupe near: clusters dealt to the splits at their fractions, each whole
(beam_jobs/near_splits.py).

The corpus: 40 photo-like sources each with its seven variants (clusters of 8: 2 %
of the 400 inputs each) and 80 photos alone. Placed by their smallest key's hash,
as before, 40 clusters of 8 miss a 10 % split by a few clusters; dealt, each split is
within the largest cluster of its fraction.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from conftest import assert_multi_process_gives_the_same_bytes, run_convert
from test_near import split_of_keys, variants

from beam_jobs.near_splits import SplitRule, deal
from convert_core.split import HASH_BUCKETS, cut_points, pick
from evenshard.synthetic import photo_bytes

CLUSTERS, ALONE, SIZE = 40, 80, 8
SPLITS = ("train", "val", "test")
FRACTIONS = (0.8, 0.1, 0.1)
FLAGS = ("--dedupe=near", "--splits=train=0.8,val=0.1,test=0.1", "--split_seed=3")


@pytest.fixture(scope="module")
def clustered(tmp_path_factory):
    """The folder, and the truth: key -> its source (a cluster), or None (alone)."""
    root = tmp_path_factory.mktemp("near_splits") / "images"
    rng = np.random.default_rng(11)
    truth = {}
    for i in range(CLUSTERS + ALONE):
        label = f"l{i % 4}"
        (root / label).mkdir(parents=True, exist_ok=True)
        data = photo_bytes(rng, 96, 128)
        (root / label / f"src{i:03d}.jpg").write_bytes(data)
        truth[f"{label}/src{i:03d}.jpg"] = i if i < CLUSTERS else None
        if i < CLUSTERS:
            for name, (ext, v) in variants(data, i).items():
                (root / label / f"{name}{i:03d}{ext}").write_bytes(v)
                truth[f"{label}/{name}{i:03d}{ext}"] = i
    out = str(tmp_path_factory.mktemp("near_splits_out") / "out")
    return str(root), truth, run_convert(str(root), out, *FLAGS), out


def _hash_split(key: str) -> str:
    """The split a key's hash gives (hash mode, ``--split_seed=3``)."""
    rule = SplitRule(SPLITS, FRACTIONS, 3)
    return SPLITS[pick(cut_points(list(FRACTIONS), HASH_BUCKETS), rule.bucket(key))]


def test_each_split_within_the_largest_cluster_of_its_fraction(clustered):
    root, truth, info, out = clustered
    assert info["near_duplicates"]["clusters"] == CLUSTERS
    assert info["near_duplicates"]["largest_cluster"] == SIZE
    where = split_of_keys(out)
    total = len(truth)
    counts = Counter(where.values())
    for name, fraction in zip(SPLITS, FRACTIONS):
        assert abs(counts[name] - fraction * total) <= SIZE, (name, counts)
    # the rule before (each cluster where its smallest key's hash puts it) missed that
    before = Counter(
        _hash_split(min(k for k, s in truth.items() if s == source) if source is not None else key)
        for key, source in truth.items()
    )
    assert max(abs(before[n] - f * total) for n, f in zip(SPLITS, FRACTIONS)) > 2 * SIZE


def test_a_cluster_is_never_split_and_an_image_alone_keeps_its_hash_split(clustered):
    _, truth, _, out = clustered
    where = split_of_keys(out)
    assert len(where) == len(truth)
    for source in range(CLUSTERS):
        assert len({where[k] for k, s in truth.items() if s == source}) == 1, source
    alone = [k for k, s in truth.items() if s is None]
    assert all(where[k] == _hash_split(k) for k in alone)  # as the plain convert puts it
    moved = sum(
        where[k] != _hash_split(min(m for m, s in truth.items() if s == truth[k]))
        for k in truth
        if truth[k] is not None and k.split("/")[1].startswith("src")
    )
    assert moved < CLUSTERS // 2  # most clusters keep the split their hash gives


def test_the_same_bytes_in_memory_and_with_two_processes(clustered, tmp_path):
    assert_multi_process_gives_the_same_bytes(clustered[0], tmp_path, *FLAGS)


def test_deal_cuts_the_hash_order_at_each_splits_need():
    rule = SplitRule(SPLITS, FRACTIONS, 0)
    rng = np.random.default_rng(2)
    sizes = {f"c{i:04d}": int(s) for i, s in enumerate(rng.integers(2, 60, 300))}
    fixed = {"train": 4000, "val": 700, "test": 300}  # the images alone: val over, test under
    placed = deal(sizes, fixed, rule)
    total = sum(sizes.values()) + sum(fixed.values())
    got = Counter(fixed)
    for key, split in placed.items():
        got[split] += sizes[key]
    for name, fraction in zip(SPLITS, FRACTIONS):
        assert abs(got[name] - fraction * total) <= max(sizes.values()), (name, got)
    assert deal(sizes, fixed, rule) == placed == deal(dict(reversed(sizes.items())), fixed, rule)
    # a cluster added moves only the clusters near a cut
    grown = deal({**sizes, "c9999": 30}, fixed, rule)
    assert sum(grown[k] != placed[k] for k in sizes) < len(sizes) // 20
    # more images alone than a split's share: that split gets no cluster
    assert "val" not in deal(sizes, {"train": 4000, "val": 9000, "test": 0}, rule).values()
    assert deal({}, fixed, rule) == {}


def test_the_fingerprints_agree_with_the_splits(clustered):
    """The .near sidecars list every key in its split (a record moved by the dealing is
    written where its cluster went)."""
    from schemas import load_info, near

    _, truth, _, out = clustered
    where = split_of_keys(out)
    info = load_info(out)
    for split in info["splits"]:
        for shard in info["splits"][split]["shards"]:
            with open(os.path.join(out, shard["near"]), "rb") as f:
                assert all(where[k] == split for k, _ in near.parse_sidecar(f.read()))
