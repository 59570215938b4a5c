"""AssignSplits: each image to exactly one split, by the rule of ``convert_core.split``
(a given split wins; else ``hash`` or ``exact``), the exact ranks within labels taken
over workers (``ExactRank``).
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs.rank import ExactRank
from convert_core.fingerprint import fp
from convert_core.rank import LABEL_BUCKET_BITS, top_bucket
from convert_core.split import HASH_BUCKETS, cut_points, exact_split, given_or_hashed


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
                lambda im: (given_or_hashed(im, names, cuts, seed), im)
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
            return exact_split(names, fractions, rank, total), im

        return (
            images
            | "ByLabel" >> beam.Map(to_rank)
            # (label, rank within label, label count, Image)
            | "RankInLabel" >> ExactRank()
            | "CutAtFractions" >> beam.Map(to_split)
        )
