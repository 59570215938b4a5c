"""Vocabulary: the dataset's labels (ids = positions) and image formats
(``convert_core.vocabulary``), their sets combined over workers."""

from __future__ import annotations

import apache_beam as beam

from convert_core.vocabulary import vocabulary


class Vocabulary(beam.PTransform):
    """Image -> one dict {"labels": [...], "formats": [...]} (``vocabulary``: ``fixed``,
    a ``--labels`` file's, or the images' own; ``numbered``: a record's int labels)."""

    def __init__(self, fixed: list[str] | None = None, numbered: bool = False):
        super().__init__()
        self._fixed = list(fixed) if fixed else None
        self._numbered = numbered

    def expand(self, images):
        fixed, numbered = self._fixed, self._numbered

        def collect(found):
            labels, formats = found
            return vocabulary(labels, formats, fixed, numbered)

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
