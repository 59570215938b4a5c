"""Near-duplicates across splits (``evenshard leaks DATASET [OTHER]``).

A validation image whose resized or re-encoded copy is in train scores as if
seen; the audit finds such images from their fingerprints (``schemas.near``):
across the splits of one dataset, or between two datasets (a test set of the
user's own against a training set). Fingerprints come from the ``.near``
files ``convert --dedupe near`` writes beside each shard, so nothing is
decoded; a dataset without them has its images decoded once here.

Pairs are found as convert finds them (fingerprints that share a band value
are compared, so the work is the band values' sizes squared, not the
dataset's; identical fingerprints are compared once), but by a wider rule:
``near.AUDIT_DISTANCE`` bits and the thumbnails' thresholds
``near.AUDIT_SLACK`` times as wide. The audit asking convert's own question
would see nothing convert missed; each pair says whether convert's rule
matches it (then the grouping let it through: a pair cut between two star
clusters, each image a near-duplicate of its own cluster's centre, a split given
by the manifest, or no ``--dedupe near``), and the report counts the images
whose near-duplicates across lie beyond that rule. The pair rule is convert's
own (``near.matches``, thumbnails compared in the fingerprints' hex order, as
convert's buckets and clusters compare them).
"""

from __future__ import annotations

import io
import json

import numpy as np

from schemas import features, layout, near, near_embedding, near_pairs, storage, tfrecord
from schemas.dataset_info import DatasetInfo, ShardInfo, load_dataset_info
from schemas.errors import InvalidValueError
from schemas.example import parse_example
from schemas.info import DatasetError


class Side:
    """The fingerprints of one dataset's splits: keys, values, and where each record is."""

    def __init__(self, data_dir: str, name: str = "", path_root: str | None = None, like=None):
        self.data_dir = data_dir
        self.name = name  # "" for DATASET, else a prefix for OTHER's splits
        self.info = load_dataset_info(data_dir)
        # --near_embedding's MODULE:FUNCTION the fingerprints are vectors of (None: the
        # hash's): this dataset's rule, or that of ``like`` (OTHER is compared by
        # DATASET's); the .near files are read where the dataset was converted with it
        self.embedding = rule_of((like or self).info).get("embedding")
        self._fn = None
        if self.info.record_kind not in ("image", "path"):  # example: records as they were
            raise DatasetError(
                f"{data_dir}: {self.info.record_kind} records hold no images to compare"
            )
        self.path_root = path_root or self.info.path_root or ""
        self.keys: list[str] = []
        self.values: list[str] = []  # the fingerprints (schemas.near)
        self.splits: list[str] = []
        self.where: list[tuple[str, int]] = []  # (shard file, record index)
        # records whose image does not decode (a dataset converted with --verify header
        # can hold one): (split, key, why), left out of the audit and named in its report
        self.undecoded: list[tuple[str, str, str]] = []
        self.stored = True
        for s in self.info.splits:
            for shard in s.shards:
                found = self._stored(shard) if shard.near else None
                if found is None or len(found) != shard.num_examples:
                    self.stored = False
                    found = self._computed(shard)
                for index, (key, value) in enumerate(found):
                    if isinstance(value, Exception):
                        self.undecoded.append((name + s.name, key, value.detail))
                        continue
                    self.keys.append(key)
                    self.values.append(value)
                    self.splits.append(name + s.name)
                    self.where.append((shard.file, index))

    def _stored(self, shard: ShardInfo) -> list[tuple[str, str]] | None:
        """The shard's ``.near`` lines; None when the file is gone or unreadable (its
        images are then decoded)."""
        try:
            found = self.info.near_duplicates
            if (found or {}).get("embedding") != self.embedding:  # another rule's fingerprints
                return None
            data = storage.read_bytes(layout.join(self.data_dir, shard.near))
            return near.parse_sidecar(data, near.sidecar_chars(found))
        except (OSError, ValueError):
            return None

    def _computed(self, shard: ShardInfo) -> list[tuple[str, str | Exception]]:
        """(key, fingerprint) of each record of a shard, its image decoded here; (key, the
        ``Rejected``) where the image does not decode."""
        from schemas.images import Rejected, inspect_stream

        out = []
        path = layout.join(self.data_dir, shard.file)
        for raw in tfrecord.iter_records(path):
            feature = parse_example(raw)
            key = feature[features.KEY].decode("utf-8", "surrogateescape")
            data = self.image_bytes(feature)
            pixels = self.embedding is not None
            try:
                *_, value = inspect_stream(
                    io.BytesIO(data),
                    len(data),
                    full=True,
                    max_pixels=1 << 62,
                    near=True,
                    pixels=pixels,
                )
            except Rejected as e:
                out.append((key, e))
                continue
            if pixels:  # the user's function, one image at a time
                self._fn = self._fn or self._embedding_function()
                if getattr(self._fn, "batched", False):
                    value = self._fn([value])[0]
                else:
                    value = self._fn(value)
                value = near_embedding.quantised(value, self.embedding, key).tobytes().hex()
            out.append((key, value))
        return out

    def _embedding_function(self):
        """The --near_embedding function DATASET was converted with (its dataset_info.json
        names it: leaks has no flag for it), to embed images with no stored vector."""
        try:
            return near_embedding.load(self.embedding)
        except InvalidValueError as e:
            raise InvalidValueError(
                f"{e} (the model the dataset was converted with, named in its "
                "dataset_info.json: leaks embeds this dataset's images with it)"
            ) from None

    def image_bytes(self, feature: dict) -> bytes:
        if self.info.record_kind == "image":
            return feature[features.ENCODED]
        root = self.path_root.rstrip("/")
        return storage.read_bytes(f"{root}/{feature[features.PATH].decode()}")

    def image(self, index: int):
        """The Pillow image of record ``index`` of this side."""
        from PIL import Image

        shard, at = self.where[index]
        for i, raw in enumerate(tfrecord.iter_records(layout.join(self.data_dir, shard))):
            if i == at:
                return Image.open(io.BytesIO(self.image_bytes(parse_example(raw))))
        raise LookupError(f"{shard} has no record {at}")


def _close_unique(unique: list[str], distance: int, slack: float, rule: int):
    """(u, v, bits, grouped) for distinct fingerprints u < v that match within
    ``distance`` bits and ``slack`` times the thumbnails' thresholds, or by convert's
    rule (``rule`` bits, the thresholds as they are; grouped: whether it matches them):
    an audit narrower in bits than convert's rule still sees every pair convert's rule
    matches, so the gate is convert's whatever ``--distance``."""
    parsed = [near.parse(fp) for fp in unique]
    reach = max(distance, rule)
    out = []
    for u, v in near_pairs.candidate_pairs(parsed, reach):
        grouped = near.matches(parsed[u], parsed[v], rule) is not None
        if grouped or near.matches(parsed[u], parsed[v], distance, slack) is not None:
            out.append((u, v, near.apart(parsed[u], parsed[v], reach), grouped))
    return out


def _close_vectors(unique: list[str], threshold: float, audit: float, centre=None):
    """(u, v, weight, grouped) for distinct stored vectors u < v whose cosine is at least
    ``audit`` (found as convert finds them, by the bands of ``audit``: a superset of
    convert's); weight: (1 - cosine) scaled (``EmbeddingRule.weights``); grouped:
    whether convert's rule (cosine >= ``threshold``) matches them too."""
    vectors = near_embedding.parse_many([bytes.fromhex(v) for v in unique])
    shared = centre["shared"] if centre else 0.0  # (the bands sized from the centre)
    bands = near_embedding.bands_for(near_embedding.centred_threshold(audit, shared))
    pairs = near_embedding.candidate_pairs(vectors, bands, centre)
    out = []
    for u, v in pairs:
        c = near_embedding.cosines(vectors[u : u + 1], vectors[v : v + 1])[0, 0]
        if c >= audit:
            weight = int(near_embedding.EmbeddingRule.weights(np.array([c]))[0])
            out.append((u, v, weight, bool(c >= threshold)))
    return out


def rule_of(info: DatasetInfo) -> dict:
    """Convert's near-duplicate rule of a dataset: {"embedding", "threshold"}, or
    {"distance"} (the hash's; the default where the dataset was converted without)."""
    found = info.near_duplicates or {}
    if "embedding" in found:
        return {
            "embedding": found["embedding"],
            "threshold": found["threshold"],
            "centre": found.get("centre"),  # (None: converted before the centre)
        }
    return {"distance": found.get("distance", near.DEFAULT_DISTANCE)}


def find(
    sides: list[Side], distance: int = near.AUDIT_DISTANCE, top: int = 20, slack: float = 0
) -> dict:
    """The report: for each split, its images with a near-duplicate in each other split
    (between two datasets: OTHER's splits against DATASET's), and the ``top`` closest
    pairs. The audit's rule is wider than convert's (``distance`` bits, the thumbnails'
    thresholds ``slack`` times as wide: ``near.AUDIT_SLACK`` unless given), so it also
    sees what the split grouping did not group; each pair says whether convert's rule
    (the distance the dataset was converted with, else the default) matches it."""
    slack = slack or near.AUDIT_SLACK
    convert_rule = rule_of(sides[0].info)
    rule = convert_rule.get("distance", near.DEFAULT_DISTANCE)
    keys = [k for s in sides for k in s.keys]
    split_of = [sp for s in sides for sp in s.splits]
    side_of = np.array([i for i, s in enumerate(sides) for _ in s.keys], dtype=np.int64)
    names = list(dict.fromkeys(split_of))
    if len(names) > 63:
        raise InvalidValueError(f"{len(names)} splits: at most 63 can be audited together")
    group = np.array([names.index(sp) for sp in split_of], dtype=np.int64)
    unique, inverse = np.unique(np.array([v for s in sides for v in s.values]), return_inverse=True)
    inverse = inverse.ravel()
    masks = np.zeros(len(unique), dtype=np.uint64)
    np.bitwise_or.at(masks, inverse, np.left_shift(np.uint64(1), group.astype(np.uint64)))
    if "embedding" in convert_rule:  # the user's vectors, by cosine (Side.embedding)
        threshold = convert_rule["threshold"]
        audit = max(0.0, threshold - near_embedding.AUDIT_MARGIN)
        close = _close_vectors(list(unique), threshold, audit, convert_rule.get("centre"))
    else:
        close = _close_unique(list(unique), distance, slack, rule)
    reach = masks.copy()  # the splits holding the value or a value that matches
    inner = masks.copy()  # the same, by convert's rule
    for u, v, _, grouped in close:
        for seen in (reach, inner) if grouped else (reach,):
            seen[u] |= masks[v]
            seen[v] |= masks[u]
    counted = [i for i, s in enumerate(names) if len(sides) == 1 or s.startswith(sides[1].name)]
    against = [i for i, s in enumerate(names) if len(sides) == 1 or i not in counted]
    leaked: dict[str, dict[str, int]] = {}
    leaked_images = np.zeros(len(keys), dtype=bool)
    by_rule = np.zeros(len(keys), dtype=bool)  # leaked by convert's rule too
    for g in counted:
        mine = group == g
        row = {}
        for h in against:
            if h == g:
                continue
            hit = mine & ((reach[inverse] >> np.uint64(h)) & np.uint64(1)).astype(bool)
            row[names[h]] = int(hit.sum())
            leaked_images |= hit
            by_rule |= mine & ((inner[inverse] >> np.uint64(h)) & np.uint64(1)).astype(bool)
        leaked[names[g]] = row
    pairs = _closest(close, masks, inverse, group, side_of, len(sides), top, keys)
    embedded = "embedding" in convert_rule
    return {
        "rule": {k: v for k, v in convert_rule.items() if k != "centre"},  # (a vector)
        "audit_rule": {"threshold": audit} if embedded else {"distance": distance},
        "distance": None if embedded else distance,
        "convert_distance": None if embedded else rule,
        "fingerprints": "stored" if all(s.stored for s in sides) else "computed",
        "images": {n: int((group == i).sum()) for i, n in enumerate(names)},
        "leaked": leaked,
        "leaked_images": int(leaked_images.sum()),
        "beyond_convert_rule": int((leaked_images & ~by_rule).sum()),
        "undecoded": [
            {"split": split, "key": key, "reason": why}
            for side in sides
            for split, key, why in side.undecoded
        ],
        "closest": [
            {
                **(
                    {"cosine": round(1 - bits / near_embedding.WEIGHT_SCALE, 4)}
                    if embedded
                    else {"bits": bits}
                ),
                "grouped_by_convert_rule": grouped,
                "a": {"split": split_of[a], "key": keys[a]},
                "b": {"split": split_of[b], "key": keys[b]},
                "index": (a, b),
            }
            for bits, grouped, a, b in pairs
        ],
    }


def _closest(close, masks, inverse, group, side_of, num_sides: int, top: int, keys):
    """The ``top`` closest pairs of images in two splits (two datasets): (bits, grouped
    by convert's rule, a, b), fewest bits first."""
    members: dict[int, list[int]] = {}
    for i in np.argsort(inverse, kind="stable"):
        members.setdefault(int(inverse[i]), []).append(int(i))

    def apart(a: int, b: int) -> bool:
        if num_sides == 2:
            return side_of[a] != side_of[b]
        return group[a] != group[b]

    def spans(u: int, v: int) -> bool:  # the values are in two splits between them
        both = int(masks[u] | masks[v])
        return both & (both - 1) != 0

    if top <= 0:
        return []
    candidates = [(0, True, u, u) for u, m in members.items() if len(m) > 1 and spans(u, u)]
    candidates += [(bits, grouped, u, v) for u, v, bits, grouped in close if spans(u, v)]
    out = []
    for bits, grouped, u, v in sorted(candidates):
        for pair in ((a, b) for a in members[u] for b in members[v] if a < b or u != v):
            if apart(*pair):
                a, b = sorted(pair, key=lambda i: (side_of[i], group[i], keys[i]))
                out.append((bits, grouped, a, b))
                if len(out) == top:
                    return out
    return out


def shown(key: str) -> str:
    """A key on one line of text: as it is, or escaped as JSON escapes it when it holds a
    line break, another control character or undecodable bytes."""
    return key if key.isprintable() else json.dumps(key)[1:-1]


def render(report: dict) -> str:
    """The report as text: counts per split pair, then the closest pairs."""
    rule = report["rule"]
    if "embedding" in rule:
        audit = f"cosine >= {report['audit_rule']['threshold']:g} by {rule['embedding']}"
        convert = f"cosine >= {rule['threshold']:g}"
    else:
        audit = f"within {report['distance']} bits, thumbnails alike"
        convert = f"{report['convert_distance']} bits, the thumbnails' thresholds"
    lines = [f"near-duplicates {audit} (fingerprints {report['fingerprints']}):"]
    for split, row in report["leaked"].items():
        for other, n in row.items():
            lines.append(f"  {split:<16} {n:>7} of {report['images'][split]} have one in {other}")
    lines.append(f"  images with a near-duplicate across: {report['leaked_images']}")
    lines.append(
        f"  of them, beyond convert's rule ({convert}; the audit's is wider): "
        f"{report['beyond_convert_rule']}"
    )
    if report["closest"]:
        lines.append("  closest pairs:")
        for p in report["closest"]:
            a, b = p["a"], p["b"]
            mark = " " if p["grouped_by_convert_rule"] else "*"
            lines.append(
                f"   {mark}{closeness(p)}  {a['split']}:{shown(a['key'])}  "
                f"{b['split']}:{shown(b['key'])}"
            )
        if any(not p["grouped_by_convert_rule"] for p in report["closest"]):
            lines.append("    (*: convert's rule does not match the pair: only the audit's)")
    if report["undecoded"]:
        first = report["undecoded"][0]
        lines.append(
            f"  not audited, the image does not decode: {len(report['undecoded'])} (first: "
            f"{first['split']}:{shown(first['key'])}: {first['reason']})"
        )
    return "\n".join(lines)


def closeness(pair: dict) -> str:
    """How close a pair is, in its rule's terms: bits apart, or the cosine."""
    if "cosine" in pair:
        return f"cos {pair['cosine']:.3f}"
    return f"{pair['bits']:>2} bit{' ' if pair['bits'] == 1 else 's'}"


def to_json(report: dict) -> str:
    clean = {
        **report,
        "closest": [{k: v for k, v in p.items() if k != "index"} for p in report["closest"]],
    }
    return json.dumps(clean, indent=2, sort_keys=True)
