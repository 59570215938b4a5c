"""Vocabulary: the dataset's labels (ids = positions) and image formats."""

from __future__ import annotations

import apache_beam as beam


class Vocabulary(beam.PTransform):
    """Image -> one dict {"labels": [...], "formats": [...]}.

    Labels are the sorted distinct labels of the written images (as TFDS
    ImageFolder does), or exactly ``fixed`` (a ``--labels`` file) in its order.
    """

    def __init__(self, fixed: list[str] | None = None):
        super().__init__()
        self._fixed = list(fixed) if fixed else None

    def expand(self, images):
        fixed = self._fixed

        def collect(found):
            labels, formats = found
            return {"labels": fixed or sorted(labels), "formats": sorted(formats)}

        return (
            images
            | "LabelsAndFormats" >> beam.CombineGlobally(_LabelsAndFormats())
            | "Collect" >> beam.Map(collect)
        )


class _LabelsAndFormats(beam.CombineFn):
    """Image -> (set of labels, set of formats): one add a image, lifted before the shuffle."""

    def create_accumulator(self):
        return set(), set()

    def add_input(self, acc, im):
        acc[0].add(im.label)
        acc[1].add(im.format)
        return acc

    def merge_accumulators(self, accs):
        labels, formats = set(), set()
        for a, b in accs:
            labels |= a
            formats |= b
        return labels, formats

    def extract_output(self, acc):
        return acc
