"""The user's embedding (``--near_embedding``) over a whole run, for the near-duplicate
step (``beam_jobs.near_duplicates``): the run's centre, from which the bands take their
signs (``Centre``, stored with the rule for ``leaks``: ``with_centre``), and the check
that every vector has one length (``Lengths``, ``of_one_length``). Integers throughout:
the same on every runner and worker count.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np

from convert_core.records import Image
from schemas import near_embedding


class Centre(beam.CombineFn):
    """Images -> the run's centre (``near_embedding.centre_of``: integer sums, the same
    on any runner), or None when there is none or their lengths differ (the run stops
    on those: ``of_one_length``)."""

    def create_accumulator(self):
        return None, 0, 0  # (sum, count, sum of squared norms); a sum of None: two lengths

    def add_input(self, acc, image: Image):
        vector = np.frombuffer(bytes.fromhex(image.near), np.int8).astype(np.int64)
        return self.merge_accumulators([acc, (vector, 1, int(vector @ vector))])

    def merge_accumulators(self, accumulators):
        total, count, squares = None, 0, 0
        for part, n, sq in accumulators:
            if not n:
                continue
            if part is None or (total is not None and len(total) != len(part)):
                return None, count + n, 0
            total = part.copy() if total is None else total + part
            count, squares = count + n, squares + sq
        return total, count, squares

    def extract_output(self, acc):
        total, count, squares = acc
        return None if total is None else near_embedding.centre_of(total, count, squares)


def with_centre(described: dict, centre: tuple) -> dict:
    """The rule's description, with the embedding's centre (stored: ``leaks`` takes the
    bands from it too)."""
    return {**described, "centre": centre[0]} if centre and centre[0] is not None else described


class Lengths(beam.CombineFn):
    """Images -> {stored vector length (hex digits): the smallest key of that length}:
    as many entries as lengths, one in a sound run."""

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, found: dict, image: Image) -> dict:
        size = len(image.near)
        if size not in found or image.key < found[size]:
            found[size] = image.key
        return found

    def merge_accumulators(self, accumulators) -> dict:
        merged: dict = {}
        for found in accumulators:
            for size, key in found.items():
                if size not in merged or key < merged[size]:
                    merged[size] = key
        return merged

    def extract_output(self, found: dict) -> dict:
        return found


def of_one_length(stars: list, lengths: dict, spec: str) -> list:
    """``stars`` when every image's vector has one length; else the run stops naming an
    image of each of two lengths (before, only vectors that met in a band were compared,
    and a dataset whose vectors differed was written)."""
    if len(lengths) > 1:
        (a, key_a), (b, key_b) = sorted(lengths.items())[:2]
        raise near_embedding.InvalidValueError(
            f"--near_embedding {spec} gave vectors of {a // 2} values ({key_a}) and of "
            f"{b // 2} ({key_b}): it must return the same length for every image"
        )
    return stars
