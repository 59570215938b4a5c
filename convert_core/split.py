"""The split rule: each image to exactly one split.

- A manifest ``split`` value wins when present.
- ``hash``: bucket = fp(split_seed, "split", group or key) mod 10000, cut at
  the cumulative fractions. A key's split never changes as the dataset grows,
  and with ``--group_by`` a whole group shares one bucket, so one split.
- ``exact``: within each label, order by fingerprint and cut at exact
  fractions (stratified; per-label counts are exact roundings).

The split salt is ``--split_seed``, separate from the shuffle ``--seed``, so
reshuffling never moves examples between train and test. ``beam_jobs.split``
ranks within labels over workers (``ExactRank``); ``assign_splits`` here in one
process: the same splits.
"""

from __future__ import annotations

from convert_core.fingerprint import fp
from convert_core.rank import ranked
from convert_core.records import Image
from schemas.errors import InvalidValueError

HASH_BUCKETS = 10_000


def cut_points(fractions: list[float], n: int) -> list[int]:
    """Cumulative cut points of ``n`` items, e.g. [0.8, 0.1, 0.1], 10 -> [8, 9, 10]."""
    cuts, acc = [], 0.0
    for f in fractions:
        acc += f
        cuts.append(min(n, int(round(acc * n))))
    cuts[-1] = n
    return cuts


def pick(cuts: list[int], value: int) -> int:
    """Index of the first cut above ``value``."""
    for i, cut in enumerate(cuts):
        if value < cut:
            return i
    raise InvalidValueError(f"value {value} beyond the last cut {cuts[-1]}")


def hash_split(image: Image, names: tuple[str, ...], cuts: list[int], split_seed: int) -> str:
    unit = image.group if image.group is not None else image.key
    return names[pick(cuts, fp(split_seed, "split", unit) % HASH_BUCKETS)]


def given_or_hashed(im: Image, names: tuple[str, ...], cuts: list[int], split_seed: int) -> str:
    """``hash`` mode's split of an image: the one it gives, else its hash bucket's."""
    return im.split if im.split is not None else hash_split(im, names, cuts, split_seed)


def exact_split(names: tuple[str, ...], fractions: list[float], rank: int, total: int) -> str:
    """The split of the image ranked ``rank`` of the ``total`` of its label (``exact``)."""
    return names[pick(cut_points(fractions, total), rank)]


def assign_splits(
    images: list[Image], names: tuple[str, ...], fractions: list[float], mode: str, seed: int
) -> list[tuple[str, Image]]:
    """(split, Image) of each image, in one process: the split it gives, else its hash
    bucket's (``mode`` "hash") or its rank in its label's (``exact``), salted by ``seed``
    (``--split_seed``)."""
    if mode == "hash":
        cuts = cut_points(fractions, HASH_BUCKETS)
        return [(given_or_hashed(im, names, cuts, seed), im) for im in images]
    out = [(im.split, im) for im in images if im.split is not None]
    by_label: dict[str, list] = {}
    for im in images:
        if im.split is None:
            by_label.setdefault(im.label, []).append((fp(seed, "split", im.key), im))
    for members in by_label.values():
        total = len(members)
        out += [(exact_split(names, fractions, r, total), im) for r, im in ranked(members)]
    return out
