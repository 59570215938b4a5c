"""convert --dedupe near: the clusters' CombineFn keeps a minimum spanning forest, not
every edge (beam_jobs/near_duplicates.py ``_Forest``): the same forest whatever the order and
bundling of the edges, an accumulator never much over two edges a key, and the same
clusters as every edge gives."""

from __future__ import annotations

import numpy as np

from beam_jobs import near_duplicates as near


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
    whole = near.spanning_forest([(w, a, b) for w, a, _, b, _ in edges])
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


def test_the_forest_gives_the_clusters_every_edge_gives_and_refuses_a_bridge():
    rng = np.random.default_rng(7)
    edges = []
    for c in range(30):  # 30 dense clusters of 12 keys, every pair matched
        members = [f"c{c:02d}_{i:02d}" for i in range(12)]
        pairs = [(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
        edges += [(int(rng.integers(0, 3000)), a, b) for a, b in pairs]
    table, counts = near.clusters_of((edges, {}, set()), 360)  # at most 16 a cluster
    assert (counts["clusters"], counts["largest_cluster"], counts["bridges_refused"]) == (30, 12, 0)
    assert all(v[0] == k[:3] + "_00" for k, v in table.items())  # each its smallest key
    # a weaker edge joins two clusters of 12: past the bound, refused and named
    bridged = near.clusters_of((edges + [(5000, "c00_03", "c01_05")], {}, set()), 360)
    assert bridged[0] == table
    assert bridged[1]["bridges_refused"] == 1 and bridged[1]["bridges"] == [["c00_03", "c01_05"]]
