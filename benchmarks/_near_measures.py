"""What ``near_bench.py`` and ``near_icons_bench.py`` measure with: fingerprints
taken as convert takes them, clusters under the hash alone and under convert's
rule, the precision/recall curve, and converts read back (splits, sidecars)."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import numpy as np
from _common import BIN, run_command
from _near_corpus import EDGES, VARIANTS

MAX_DISTANCE = 20

# ---------------------------------------------------------------- (1) the curve


def fingerprints(images: str, keys: list[str]) -> list[str]:
    """Each file's fingerprint, as convert's inspection takes it."""
    from schemas.images import inspect_stream

    out = []
    for key in keys:
        path = os.path.join(images, key)
        with open(path, "rb") as f:
            out.append(
                inspect_stream(f, os.path.getsize(path), full=True, max_pixels=2**31, near=True)[4]
            )
    return out


class UnionFind:
    def __init__(self, n: int):
        self.parent = np.arange(n)

    def find(self, i: int) -> int:
        p = self.parent
        while p[i] != i:
            p[i] = p[p[i]]
            i = p[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)

    def labels(self) -> np.ndarray:
        return np.array([self.find(i) for i in range(len(self.parent))])


def pair_count(sizes) -> int:
    return int(sum(s * (s - 1) // 2 for s in sizes))


def rule_labels(keys: list[str], hexes: list[str]) -> dict[int, np.ndarray]:
    """Each file's cluster at each distance 0..MAX_DISTANCE under the rule convert uses
    (``near.matches``: the hashes within the distance with the weak bits left out, the
    thumbnails alike), clustered as convert clusters them (each connected component cut
    into star clusters: ``star_clusters``, ``clusters_of``)."""
    from beam_jobs.near_components import clusters_of, components_of
    from beam_jobs.near_stars import star_clusters
    from schemas import near, near_pairs

    n = len(keys)
    raw = {k: bytes.fromhex(h) for k, h in zip(keys, hexes)}
    index = {k: i for i, k in enumerate(keys)}
    parsed = [near.parse(h) for h in hexes]
    values = near.as_array(hexes)
    every_weak = np.array([p.weak for p in parsed], dtype=np.uint64)
    thumbs = np.stack([p.thumb for p in parsed])
    quality = np.array([p.quality for p in parsed])
    iu, ju = np.triu_indices(n, 1)
    out = {}
    for dist in range(MAX_DISTANCE + 1):
        weak = near_pairs.weak_bits_many(every_weak, dist)
        bits = np.bitwise_count((values[iu] ^ values[ju]) & ~(weak[iu] | weak[ju]))
        took = np.flatnonzero(bits <= dist)
        a, b = iu[took], ju[took]  # the second measure, for the pairs within dist
        seen = near.thumbs_apart(thumbs[a], thumbs[b], quality[a], quality[b], bits[took])
        edges = [
            (int(bits[took[m]]) * 256 + int(seen[m]), keys[a[m]], keys[b[m]])
            for m in np.flatnonzero(seen >= 0)
        ]
        forest = (edges, {}, set())
        members: dict[str, list] = {}
        for k, component in components_of(forest).items():
            members.setdefault(component, []).append((k, raw[k]))
        stars = [(c, len(m), star_clusters(m, dist)) for c, m in members.items()]
        table, _ = clusters_of(forest, stars)
        out[dist] = np.array([index[table[k][0]] if k in table else i for i, k in enumerate(keys)])
    return out


def curve(keys: list[str], hexes: list[str], truth: dict) -> tuple[list[dict], dict]:
    """(a row of figures for each distance 0..MAX_DISTANCE, what the plot and the
    false-cluster list need): the hash alone (each row), and convert's rule (each
    row's ``rule``: :func:`rule_labels`)."""
    from schemas import near, near_pairs

    values = near.as_array(hexes)
    d = near_pairs.distances(values, values)
    n = len(keys)
    source = [truth[k][0] for k in keys]
    kind = [truth[k][1] for k in keys]
    sid_index = {s: i for i, s in enumerate(sorted(set(source)))}
    t = np.array([sid_index[s] for s in source])
    true_pairs = pair_count(np.bincount(t))
    origin = {source[i]: i for i in range(n) if kind[i] == "source"}
    variants = [(i, origin[source[i]]) for i in range(n) if kind[i] in VARIANTS]
    edge = {i: f"cut5_{truth[keys[i]][3]}" for i, _ in variants if kind[i] == "cut5"}
    groups = VARIANTS + tuple(f"cut5_{e}" for e in EDGES)  # cut5 also by its edge
    iu, ju = np.triu_indices(n, 1)
    close = d[iu, ju] <= MAX_DISTANCE
    edges = sorted(zip(d[iu, ju][close].tolist(), iu[close].tolist(), ju[close].tolist()))

    def figures(dist: int, labels: np.ndarray) -> dict:
        _, sizes = np.unique(labels, return_counts=True)
        _, joint = np.unique(labels.astype(np.int64) * n + t, return_counts=True)
        pred_pairs, tp = pair_count(sizes), pair_count(joint)
        caught = Counter(kind[v] for v, s in variants if labels[v] == labels[s])
        per_kind = Counter(kind[v] for v, _ in variants)
        caught_edge = Counter(edge[v] for v, s in variants if v in edge and labels[v] == labels[s])
        per_kind.update(edge.values())
        precision = tp / pred_pairs if pred_pairs else 1.0
        recall = tp / true_pairs
        clusters = sizes[sizes > 1]
        mixed = {int(c) for c in np.unique(labels) if len(set(t[labels == c])) > 1}
        return {
            "distance": dist,
            "precision": round(precision, 4),
            "recall": round(recall, 4),
            "f1": round(2 * precision * recall / (precision + recall), 4)
            if precision + recall
            else 0.0,
            "variant_recall": round(sum(caught.values()) / len(variants), 4),
            "variant_recall_by_kind": {
                k: round((caught[k] + caught_edge[k]) / per_kind[k], 3)
                for k in groups
                if per_kind[k]
            },
            "clusters": int(len(clusters)),
            "largest_cluster": int(sizes.max()),
            "false_clusters": len(mixed),
            "false_pairs": pred_pairs - tp,
        }

    uf, e, rows = UnionFind(n), 0, []
    labels_at = {}
    rule_at = rule_labels(keys, hexes)
    for dist in range(MAX_DISTANCE + 1):
        while e < len(edges) and edges[e][0] <= dist:
            uf.union(edges[e][1], edges[e][2])
            e += 1
        labels = uf.labels()
        labels_at[dist] = labels
        rows.append({**figures(dist, labels), "rule": figures(dist, rule_at[dist])})
    same = t[iu] == t[ju]
    wall = np.array([truth[k][2] for k in keys])
    same_wall = wall[iu] == wall[ju]
    extra = {
        "labels_at": labels_at,
        "true_distances": d[iu, ju][same],
        "variant_distances": {
            k: [int(d[v, s]) for v, s in variants if k in (kind[v], edge.get(v))] for k in groups
        },
        "negative_distances_same_wallpaper": d[iu, ju][~same & same_wall],
        "negative_distances_other_wallpaper": d[iu, ju][~same & ~same_wall],
        "d": d,
        "t": t,
    }
    return rows, extra


def false_clusters(images, keys, truth, labels, t, d, limit: int = 8) -> list[dict]:
    """The clusters joining two or more source crops at one distance: their sources,
    the closest pair across two sources and its images' grayscale deviation."""
    from PIL import Image

    def std(key: str) -> float:
        with Image.open(os.path.join(images, key)) as im:
            return round(float(np.asarray(im.convert("L"), dtype=np.float32).std()), 1)

    out = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(set(t[members])) < 2:
            continue
        best = None
        for a in members:
            for b in members:
                if t[a] < t[b] and (best is None or d[a, b] < best[0]):
                    best = (int(d[a, b]), keys[a], keys[b])
        out.append(
            {
                "size": len(members),
                "sources": sorted({truth[keys[m]][0] for m in members}),
                "closest_across": list(best),
                "std": [std(best[1]), std(best[2])],
            }
        )
    out.sort(key=lambda x: (x["closest_across"][0], -x["size"]))
    return out[:limit]


def clusters(values: np.ndarray, distance: int) -> tuple[np.ndarray, dict]:
    """The connected components of fingerprints within ``distance`` bits, found as
    convert finds them (pairs within each band value's bucket): (each one's cluster,
    the pairs compared and found in the buckets, the largest bucket)."""
    from schemas import near_pairs

    unique, inverse = np.unique(values, return_inverse=True)
    uf = UnionFind(len(unique))
    work = {"pairs_compared": 0, "pairs_found": 0, "largest_bucket": 0}
    for band in near_pairs.band_values(unique, distance):
        order = np.argsort(band, kind="stable")
        for members in np.split(order, np.flatnonzero(np.diff(band[order])) + 1):
            m = len(members)
            work["pairs_compared"] += m * (m - 1) // 2
            work["largest_bucket"] = max(work["largest_bucket"], m)
            if m > 1:
                rows, cols, _ = near_pairs.close_pairs(unique[members], distance)
                for a, b in zip(rows.tolist(), cols.tolist()):
                    uf.union(int(members[a]), int(members[b]))
                work["pairs_found"] += len(rows)
    return uf.labels()[inverse], work


def recommend(rows: list[dict]) -> dict:
    best_f1 = max(rows, key=lambda r: (r["f1"], -r["distance"]))
    reaching = [r for r in rows if r["recall"] >= 0.95]
    best_precision = max(reaching, key=lambda r: (r["precision"], -r["distance"]))
    return {"best_f1": best_f1["distance"], "best_precision_recall_95": best_precision["distance"]}


def plot(rows: list[dict], extra: dict, chosen: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schemas import near

    dist = [r["distance"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    for name, style in (
        ("precision", "-o"),
        ("recall", "-s"),
        ("f1", "-^"),
        ("variant_recall", "--"),
    ):
        left.plot(dist, [r[name] for r in rows], style, markersize=3, label=name)
    left.axvline(near.DEFAULT_DISTANCE, color="gray", lw=1, ls=":", label="default now")
    left.axvline(chosen["best_f1"], color="black", lw=1, ls="--", label="best F1")
    left.set_xlabel("--near_distance (bits)")
    left.set_ylim(0, 1.02)
    left.set_xticks(range(0, MAX_DISTANCE + 1, 2))
    left.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    left.set_title("pairwise precision / recall of the clusters")
    bins = np.arange(-1, 66, 2)  # fingerprints have 32 bits set: distances are even
    for data, label in (
        (extra["true_distances"], "same source crop"),
        (extra["negative_distances_same_wallpaper"], "other crop, same wallpaper"),
        (extra["negative_distances_other_wallpaper"], "other wallpaper"),
    ):
        right.hist(data, bins=bins, histtype="step", label=label, density=True)
    right.axvline(near.DEFAULT_DISTANCE + 1, color="gray", lw=1, ls=":")
    right.set_yscale("log")
    right.set_xlabel("bits that differ between two fingerprints")
    right.set_ylabel("fraction of pairs")
    right.legend(fontsize=8)
    right.set_title("distances between pairs")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


# ---------------------------------------------------------------- (2) leakage


def convert(src: str, out: str, *flags: str) -> dict:
    """``evenshard convert`` of ``src`` into ``out`` (emptied first): its dataset_info."""
    import schemas

    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(BIN, "evenshard"), "convert", f"--input={src}", f"--output_dir={out}"]
    run_command([*cmd, *flags])
    return schemas.load_info(out)


def split_of(out: str) -> dict[str, str]:
    """{key: split} from the shards' records."""
    import schemas
    from schemas import features, layout
    from schemas.example import parse_example
    from schemas.tfrecord import iter_records

    info = schemas.load_info(out)
    where = {}
    for split, s in info["splits"].items():
        for shard in s["shards"]:
            for record in iter_records(layout.join(out, shard["file"])):
                key = parse_example(record)[features.KEY]
                where[key.decode() if isinstance(key, bytes) else key] = split
    return where


def sidecars(out: str) -> dict[str, str]:
    """{key: fingerprint} from the shards' ``.near`` files."""
    import schemas
    from schemas import layout, near

    info = schemas.load_info(out)
    found = {}
    for s in info["splits"].values():
        for shard in s["shards"]:
            with open(layout.join(out, shard["near"]), "rb") as f:
                found.update(near.parse_sidecar(f.read()))
    return found


def leaks(where: dict[str, str], truth: dict, digest: dict[str, str], held: str) -> dict:
    """Images of split ``held`` with a true near-duplicate, or a byte-identical copy, in
    train."""
    train_sources = {truth[k][0] for k, s in where.items() if s == "train"}
    train_digests = {digest[k] for k, s in where.items() if s == "train"}
    held_keys = [k for k, s in where.items() if s == held]
    leaking = [k for k in held_keys if truth[k][0] in train_sources]
    return {
        "images": len(held_keys),
        "near_duplicate_in_train": len(leaking),
        "identical_copy_in_train": sum(digest[k] in train_digests for k in held_keys),
        "leaking_sources": len({truth[k][0] for k in leaking}),
        "leaking_kinds": dict(Counter(truth[k][1] for k in leaking).most_common()),
    }
