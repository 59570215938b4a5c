"""Vocabulary: the dataset's labels (ids = positions) and image formats."""

from __future__ import annotations

import apache_beam as beam


class Vocabulary(beam.PTransform):
    """Image -> one dict {"labels": [...], "formats": [...]}.

    Labels are the sorted distinct labels of the written images (as TFDS
    ImageFolder does), or exactly ``fixed`` (a ``--labels`` file) in its order;
    ``numbered`` (a record's int labels, as text): "0" to the largest, so each
    int is its own id.
    """

    def __init__(self, fixed: list[str] | None = None, numbered: bool = False):
        super().__init__()
        self._fixed = list(fixed) if fixed else None
        self._numbered = numbered

    def expand(self, images):
        fixed, numbered = self._fixed, self._numbered

        def collect(found):
            labels, formats = found
            # "": no label, no format (--record_kind example without --label_feature)
            labels, formats = labels - {""}, formats - {""}
            if fixed:
                names = fixed
            elif numbered and labels:
                names = [str(i) for i in range(max(map(int, labels)) + 1)]
            else:
                names = sorted(labels)
            return {"labels": names, "formats": sorted(formats)}

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
