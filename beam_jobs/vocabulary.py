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

        def collect(pairs):
            labels = fixed or sorted({v for k, v in pairs if k == "label"})
            return {"labels": labels, "formats": sorted({v for k, v in pairs if k == "format"})}

        return (
            images
            | "LabelAndFormat"
            >> beam.FlatMap(lambda im: [("label", im.label), ("format", im.format)])
            | "Distinct" >> beam.Distinct()
            | "ToList" >> beam.combiners.ToList()
            | "Collect" >> beam.Map(collect)
        )
