"""convert --dedupe near: the components' CombineFn keeps a minimum spanning forest, not
every edge (beam_jobs/near_duplicates.py ``_Forest``; the forest and its components:
beam_jobs/near_components.py): the same forest whatever the order and bundling of the
edges, an accumulator never much over two edges a key, and the same components as every
edge gives; each component is cut into star clusters (``star_clusters``) that depend on
its members only, never on their order."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from beam_jobs import near_components as components
from beam_jobs import near_duplicates as near
from beam_jobs import near_stars
from evenshard.synthetic import photo_bytes
from schemas import near as schema


def _edges(rng, keys: int, count: int) -> list[tuple]:
    """(weight, key, split, key, split) edges, as the buckets yield them (a < b)."""
    out = []
    for _ in range(count):
        a, b = sorted(rng.choice(keys, size=2, replace=False))
        out.append((int(rng.integers(0, 2000)), f"k{a:05d}", None, f"k{b:05d}", None))
    return out


def test_the_forest_is_one_whatever_the_order_and_the_bundles(monkeypatch):
    monkeypatch.setattr(near, "FOREST_SLACK", 64)  # thinned often, as at scale
    rng = np.random.default_rng(4)
    keys = 400
    edges = _edges(rng, keys, 20_000) + [(0, "k00001", "val", "k00002", None)]
    fn = near._Forest()
    whole = components.spanning_forest([(w, a, b) for w, a, _, b, _ in edges])
    assert len(whole) <= keys - 1
    outputs = []
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(edges))
        accs, largest = [], 0
        for bundle in np.array_split(order, 7):
            acc = fn.create_accumulator()
            for n in bundle:
                acc = fn.add_input(acc, edges[n])
                largest = max(largest, len(acc[0]))
            accs.append(acc)
        assert largest <= 2 * keys + 64 + 1  # never every edge
        outputs.append(fn.extract_output(fn.merge_accumulators(accs)))
    assert all(out == outputs[0] for out in outputs)
    forest, given, groups = outputs[0]
    assert forest == whole and given == {"k00001": "val"} and groups == set()


def test_the_components_are_every_edges_whatever_their_size():
    """No size cap (issue 55): a weak edge joins two dense groups into one component of
    24; the component is where clusters are looked for, not a cluster."""
    rng = np.random.default_rng(7)
    edges = []
    for c in range(30):  # 30 dense groups of 12 keys, every pair matched
        members = [f"c{c:02d}_{i:02d}" for i in range(12)]
        pairs = [(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
        edges += [(int(rng.integers(0, 3000)), a, b) for a, b in pairs]
    found = components.components_of((components.spanning_forest(edges), {}, set()))
    assert len(found) == 360 and all(v == k[:3] + "_00" for k, v in found.items())
    bridged = components.components_of(
        (components.spanning_forest(edges + [(5000, "c00_03", "c01_05")]), {}, set())
    )
    assert Counter(bridged.values())["c00_00"] == 24 and len(set(bridged.values())) == 29


def _photo(seed: int) -> Image.Image:
    return Image.open(io.BytesIO(photo_bytes(np.random.default_rng(seed), 72, 96, 95)))


def _members(images: list[Image.Image], prefix: str) -> list[tuple[str, bytes]]:
    return [
        (f"{prefix}{i:03d}", bytes.fromhex(schema.fingerprint(im))) for i, im in enumerate(images)
    ]


def _has_a_centre(cluster: list[str], fingerprints: dict[str, bytes]) -> bool:
    """Whether one member matches every other member (the star's centre)."""
    parsed = {k: schema.parse(fingerprints[k].hex()) for k in cluster}
    return any(
        all(
            schema.matches(parsed[c], parsed[k], schema.DEFAULT_DISTANCE) is not None
            for k in cluster
        )
        for c in cluster
    )


@pytest.mark.parametrize("cells", [near_stars.GRID_CELLS, 64])  # 64: sampled centres, in rounds
def test_star_clusters_keep_copies_whole_and_cut_a_ramp_whatever_the_order(monkeypatch, cells):
    monkeypatch.setattr(near_stars, "GRID_CELLS", cells)
    photo = _photo(1)
    copies = _members(
        [
            ImageEnhance.Brightness(photo.resize((40 + 4 * s, 30 + 3 * s))).enhance(0.9 + b / 50)
            for s in range(15)
            for b in range(10)
        ],
        "copy",
    )
    ramp = _members(
        [ImageEnhance.Brightness(_photo(2)).enhance(0.1 * 30 ** (i / 99)) for i in range(100)],
        "ramp",
    )
    fingerprints = dict(copies + ramp)
    assert near_stars.star_clusters(copies, schema.DEFAULT_DISTANCE) == [
        sorted(k for k, _ in copies)
    ]
    found = near_stars.star_clusters(ramp, schema.DEFAULT_DISTANCE)
    assert len(found) > 1 and all(_has_a_centre(c, fingerprints) for c in found)
    for seed in range(3):  # the members in another order: the same clusters
        shuffled = [ramp[i] for i in np.random.default_rng(seed).permutation(len(ramp))]
        assert near_stars.star_clusters(shuffled, schema.DEFAULT_DISTANCE) == found


def _hub_and_copies(count: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """A picture's fingerprint (``hub``) and ``count`` copies, each with a different 10 of
    its 63 banded bits flipped: every copy matches the hub, few match each other (two
    copies are about 20 bits apart)."""
    rng = np.random.default_rng(seed)
    hub = int(rng.integers(0, 1 << 62))
    tail = bytes([40]) + bytes(rng.integers(60, 200, 76, dtype=np.uint8))  # quality, thumbnail

    def fingerprint(value: int) -> bytes:
        return value.to_bytes(8, "big") + bytes(8) + tail  # no weak bits

    out = [("hub", fingerprint(hub))]
    for i in range(count):
        value = hub
        for bit in rng.choice(63, size=schema.DEFAULT_DISTANCE, replace=False).tolist():
            value ^= 1 << bit
        out.append((f"copy{i:05d}", fingerprint(value)))
    return out


def test_a_hub_with_thousands_of_copies_is_one_star_where_centres_are_sampled():
    """Above ``GRID_CELLS`` pairs a round the candidates are a sample, and the members
    that match most of it: the copy every other copy matches is found, not cut into
    hundreds of clusters (before: 20,000 copies, 553 clusters, the largest 160)."""
    members = _hub_and_copies(20_000)
    assert len(members) ** 2 > near_stars.GRID_CELLS  # sampled rounds
    whole = [sorted(k for k, _ in members)]
    assert near_stars.star_clusters(members, schema.DEFAULT_DISTANCE) == whole
    shuffled = [members[i] for i in np.random.default_rng(1).permutation(len(members))]
    assert near_stars.star_clusters(shuffled, schema.DEFAULT_DISTANCE) == whole


def test_a_member_two_centres_match_goes_to_the_closer():
    """Centres are taken most matched first; a member that a later centre matches more
    closely goes to it (it went to the first centre that matched it: a cut copy of one
    picture landed with another picture on the photo bench)."""
    thumb = bytes(np.random.default_rng(2).integers(0, 256, 76, dtype=np.uint8))

    def fp(value: int) -> bytes:
        return value.to_bytes(8, "big") + bytes(8) + bytes([40]) + thumb  # no weak bits

    def flipped(value: int, bits) -> int:
        for b in bits:
            value ^= 1 << b
        return value

    a = int(np.random.default_rng(3).integers(0, 2**62))
    b = flipped(a, range(0, 24, 2))  # 12 bits from a: no match
    m = flipped(b, range(0, 6, 2))  # 3 bits from b, 9 from a: both match it; a the most
    members = [("a", fp(a)), ("b", fp(b)), ("m", fp(m))]
    members += [(f"a{i}", fp(flipped(a, [40 + i, 50 + i]))) for i in range(3)]  # 11 from m
    rule = schema.DEFAULT_DISTANCE
    assert near_stars.star_clusters(members, rule) == [["a", "a0", "a1", "a2"], ["b", "m"]]
