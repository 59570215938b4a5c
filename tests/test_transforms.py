"""Transform-level tests: TestPipeline, a tiny beam.Create, assert_that."""

from __future__ import annotations

import collections
import itertools

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.inspect_images import InspectImages
from beam_jobs.order import OrderAndShard
from beam_jobs.plan_shards import PlanShards
from beam_jobs.rank import ExactRank
from beam_jobs.split import AssignSplits
from convert_core.fingerprint import fp
from convert_core.inspection import Inspector
from convert_core.plan_shards import shard_count
from convert_core.rank import top_bucket
from convert_core.records import Candidate, Image
from convert_core.split import HASH_BUCKETS, cut_points, hash_split
from evenshard import synthetic

pytestmark = pytest.mark.fast  # the unit lane: make test-fast


def image(key: str, label: str = "a", split: str | None = None, group: str | None = None):
    return Image(key, "/src/" + key, "", label, split, group, "png", 4, 4, 3, 100)


def test_inspect_images_reads_metadata_and_routes_rejects(tmp_path):
    rng = np.random.default_rng(0)
    good = tmp_path / "good.webp"
    good.write_bytes(synthetic.image_bytes("webp", 20, 30, rng))
    gray = tmp_path / "gray.png"
    gray.write_bytes(synthetic.image_bytes("png", 5, 7, rng, mode="L"))
    bad = tmp_path / "bad.png"
    bad.write_bytes(synthetic.image_bytes("png", 20, 30, rng)[:70])
    candidates = [Candidate(p.name, str(p), "", "x") for p in (good, gray, bad)]
    candidates.append(Candidate("gone.png", str(tmp_path / "gone.png"), "", "x"))
    with TestPipeline() as p:
        out = (
            p
            | beam.Create(candidates)
            | InspectImages(Inspector("full", 10**6, str(tmp_path), 10**6))
        )
        assert_that(
            out["main"]
            | "Meta" >> beam.Map(lambda im: (im.key, im.format, im.height, im.width, im.channels)),
            equal_to([("good.webp", "webp", 20, 30, 3), ("gray.png", "png", 5, 7, 1)]),
            label="Images",
        )
        assert_that(
            out["rejects"] | "Reason" >> beam.Map(lambda r: (r.key, r.reason)),
            equal_to([("bad.png", "truncated"), ("gone.png", "missing")]),
            label="Rejects",
        )


def test_exact_rank_equals_a_full_sort():
    values = [(part, fp(1, "t", f"{part}{i}")) for part in "xyz" for i in range(300)]
    elements = [(part, r, top_bucket(r), image(f"{part}{i}")) for i, (part, r) in enumerate(values)]
    # equal fingerprints: the rank follows the key
    elements += [("x", 12345, top_bucket(12345), image(f"tie{j}")) for j in (3, 1, 2)]
    expected = []
    for part in "xyz":
        mine = sorted(e for e in elements if e[0] == part)
        expected += [(part, rank, len(mine), e[3]) for rank, e in enumerate(mine)]
    with TestPipeline() as p:
        assert_that(p | beam.Create(elements) | ExactRank(), equal_to(expected))


def test_assign_splits_hash_exact_and_given():
    images = [image(f"k{i}", label="ab"[i % 2]) for i in range(200)]
    images += [image("given", split="holdout")]
    names, fractions = ("train", "test"), (0.5, 0.5)
    cuts = cut_points([0.5, 0.5], HASH_BUCKETS)
    hashed = [(hash_split(im, ("train", "test"), cuts, 0), im.key) for im in images[:-1]]
    with TestPipeline() as p:
        created = p | beam.Create(images)
        got = (
            created
            | "Hash" >> AssignSplits(names, fractions, "hash", 0)
            | "K1" >> beam.Map(lambda e: (e[0], e[1].key))
        )
        assert_that(got, equal_to(hashed + [("holdout", "given")]), label="Hash")
        exact = (
            created
            | "Exact" >> AssignSplits(names, fractions, "exact", 0)
            | "Count" >> beam.Map(lambda e: ((e[0], e[1].label), 1))
            | beam.CombinePerKey(sum)
        )
        assert_that(
            exact,
            equal_to(
                [
                    (("train", "a"), 50),
                    (("test", "a"), 50),
                    (("train", "b"), 50),
                    (("test", "b"), 50),
                    (("holdout", "a"), 1),
                ]
            ),
            label="Exact",
        )


def test_group_keeps_one_split_in_hash_mode():
    images = [image(f"k{i}", group=f"g{i // 10}") for i in range(500)]
    cuts = cut_points([0.8, 0.1, 0.1], HASH_BUCKETS)
    by_group = collections.defaultdict(set)
    for im in images:
        by_group[im.group].add(hash_split(im, ("train", "val", "test"), cuts, 0))
    assert all(len(s) == 1 for s in by_group.values())


@pytest.mark.parametrize("num_shards, bucket_bits", [(3, 12), (7, 2), (50, 1), (1, 0)])
def test_order_and_shard_follows_the_fingerprint_order(num_shards, bucket_bits, monkeypatch):
    """Shard = rank * S // N, ranks in fingerprint order; with few buckets every
    bucket crosses shard boundaries, and shards still get exactly their ranks.
    Tiny batches: items cross the shuffle in full batches, in batches sent when a
    worker holds too many, and in those left at the end of a bundle."""
    from beam_jobs import order

    monkeypatch.setattr(order, "BATCH", 3)
    monkeypatch.setattr(order, "MAX_HELD", 7)
    images = [image(f"k{i}") for i in range(50)] + [image(f"v{i}") for i in range(9)]
    splits = [("train", im) for im in images[:50]] + [("val", im) for im in images[50:]]
    shards = {"train": num_shards, "val": 2}
    expected = []
    for split, members in (("train", images[:50]), ("val", images[50:])):
        order = sorted(members, key=lambda im: (fp(4, "order", im.key), im.key))
        n, s = len(order), shards[split]
        for shard in range(s):
            keys = [im.key for rank, im in enumerate(order) if rank * s // n == shard]
            expected.append(((split, shard), keys))
    with TestPipeline() as p:
        split_images = p | beam.Create(splits)
        plan = split_images | PlanShards(
            ("train", "val"), "path", 1.0, 1, None, 4, "none", bucket_bits=bucket_bits
        )
        plan = plan | beam.Map(lambda pl: {k: dict(v, num_shards=shards[k]) for k, v in pl.items()})
        got = (
            split_images
            | OrderAndShard(4, "none", plan, bucket_bits=bucket_bits)
            | beam.Map(lambda e: (e[0], [im.key for im in e[1]]))
        )
        assert_that(got, equal_to(expected))


def test_order_is_a_uniform_permutation_across_seeds():
    """Chi-square on (item, position) counts over many seeds: uniform, no position bias."""
    from scipy.stats import chisquare

    n, seeds = 8, 4000
    keys = [f"img_{i:03d}.jpg" for i in range(n)]  # sorted, similar keys: the hard case
    counts = np.zeros((n, n))
    for seed in range(seeds):
        order = sorted(range(n), key=lambda i: fp(seed, "order", keys[i]))
        for position, item in enumerate(order):
            counts[item, position] += 1
    assert chisquare(counts.ravel()).pvalue > 0.001
    # adjacent pairs are independent too: each ordered pair is neighbours equally often
    pairs = collections.Counter()
    for seed in range(seeds):
        order = sorted(range(n), key=lambda i: fp(seed, "order", keys[i]))
        pairs.update(itertools.pairwise(order))
    assert chisquare(list(pairs.values())).pvalue > 0.001
    assert len(pairs) == n * (n - 1)


def test_shard_count_rules():
    assert shard_count(0, 0, 100, 1, None) == 0
    assert shard_count(10, 1, 100, 1, None) == 1
    assert shard_count(1000, 950, 100, 1, None) == 10
    assert shard_count(1000, 950, 100, 4, None) == 12  # rounded up to a multiple
    assert shard_count(5, 10**9, 100, 1, None) == 5  # never more than examples
    assert shard_count(1000, 1, 100, 1, 7) == 7  # --num_shards wins
    # --examples_per_shard: ceil(n / N), rounded up to a multiple, at most n
    assert shard_count(1000, 10**9, 100, 1, None, per_shard=100) == 10
    assert shard_count(1001, 1, 100, 1, None, per_shard=100) == 11
    assert shard_count(1001, 1, 100, 4, None, per_shard=100) == 12
    assert shard_count(3, 1, 100, 4, None, per_shard=1) == 3


def test_fingerprint_is_pinned():
    # Cross-version determinism: these values must never change.
    assert fp(0, "order", "cat/001.jpg") == 539052719554673185
    assert fp(1, "split", "cat/001.jpg") % HASH_BUCKETS == 3718


def test_sources_travel_compact_and_come_back_whole():
    from convert_core.paths import compact_source, full_source

    cases = [
        ("/data", "/data/cat/1.jpg", "cat/1.jpg", ""),
        ("/data", "/data/cat/1.jpg", "my-key", "cat/1.jpg"),
        ("/data", "/elsewhere/1.jpg", "k", "/elsewhere/1.jpg"),
        ("gs://b/data", "gs://b/data/x.png", "x.png", ""),
        ("gs://b/data", "gs://other/x.png", "k", "gs://other/x.png"),
    ]
    for root, path, key, compact in cases:
        assert compact_source(root, path, key) == compact
        assert full_source(root, compact, key) == path
