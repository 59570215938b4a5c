"""AssignSplits: each image to exactly one split.

- A manifest ``split`` value wins when present.
- ``hash``: bucket = fp(split_seed, "split", group or key) mod 10000, cut at
  the cumulative fractions. A key's split never changes as the dataset grows,
  and with ``--group_by`` a whole group shares one bucket, so one split.
- ``exact``: within each label, order by fingerprint and cut at exact
  fractions (stratified; per-label counts are exact roundings).

The split salt is ``--split_seed``, separate from the shuffle ``--seed``, so
reshuffling never moves examples between train and test.
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs.rank import LABEL_BUCKET_BITS, ExactRank, top_bucket
from convert_core.fingerprint import fp
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


class AssignSplits(beam.PTransform):
    """Image -> (split, Image): to one of ``names`` by ``fractions`` (``mode`` "hash" or
    "exact", salted by ``seed``: ``--split_seed``), or to the split the image gives."""

    def __init__(self, names: tuple[str, ...], fractions: tuple[float, ...], mode: str, seed: int):
        super().__init__()
        self._names = tuple(names)
        self._fractions = list(fractions)
        self._mode = mode
        self._seed = seed

    def expand(self, images):
        if self._mode == "hash":  # one step: a given split, else the key's hash bucket
            cuts = cut_points(self._fractions, HASH_BUCKETS)
            names, seed = self._names, self._seed
            return images | "HashSplit" >> beam.Map(
                lambda im: (
                    im.split if im.split is not None else hash_split(im, names, cuts, seed),
                    im,
                )
            )
        # Two Filters rather than beam.Partition: see dead_letters.py (Dask).
        honoured = (
            images
            | "HasGivenSplit" >> beam.Filter(lambda im: im.split is not None)
            | "GivenSplit" >> beam.Map(lambda im: (im.split, im))
        )
        rest = images | "NoGivenSplit" >> beam.Filter(lambda im: im.split is None)
        assigned = rest | "ExactSplit" >> _ExactSplit(self._names, self._fractions, self._seed)
        return (honoured, assigned) | "AllSplits" >> beam.Flatten()


class _ExactSplit(beam.PTransform):
    """Image -> (split, Image), stratified by label with exact per-label counts."""

    def __init__(self, names, fractions, seed):
        super().__init__()
        self._names, self._fractions, self._seed = names, fractions, seed

    def expand(self, images):
        seed, names, fractions = self._seed, self._names, self._fractions

        def to_rank(im):
            r = fp(seed, "split", im.key)
            return im.label, r, top_bucket(r, LABEL_BUCKET_BITS), im

        def to_split(ranked):
            _, rank, total, im = ranked
            return names[pick(cut_points(fractions, total), rank)], im

        return (
            images
            | "ByLabel" >> beam.Map(to_rank)
            # (label, rank within label, label count, Image)
            | "RankInLabel" >> ExactRank()
            | "CutAtFractions" >> beam.Map(to_split)
        )
