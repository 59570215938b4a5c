"""DedupeContent (``--dedupe content``): one example per distinct image content.

Real datasets hold the same image under two names (a re-upload, a copy in a
second class folder). Such copies leak between splits whatever the split
rule, since they have different keys. Here images are grouped by the sha256
of their bytes (taken at inspection); the one with the smallest key is kept,
the others are ``duplicate_content`` rejects naming it. Deterministic on
every runner; memory per worker: the images of one content hash.
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs.dead_letters import SplitRejects
from convert_core import paths
from convert_core.records import make_reject


class _KeepSmallestKey(beam.DoFn):
    """(sha256, [Image]) -> the Image with the smallest key; the others are Rejects."""

    def __init__(self, source_root: str | None):
        self._root = source_root

    def process(self, element):
        _, images = element
        first, *copies = sorted(images, key=lambda im: im.key)
        yield first
        for im in copies:
            source = paths.full_source(self._root, im.source, im.key)
            yield make_reject(im.key, source, "duplicate_content", f"the same bytes as {first.key}")


class DedupeContent(beam.PTransform):
    """Image (with ``content``) -> {main: Image, rejects: Reject}."""

    def __init__(self, source_root: str | None):
        super().__init__()
        self._root = source_root

    def expand(self, images):
        # Image -> (sha256, Image) -> (sha256, [Image]) -> Image | Reject
        return (
            images
            | "KeyByContent" >> beam.Map(lambda im: (im.content, im))
            | "GroupByContent" >> beam.GroupByKey()
            | "KeepSmallestKey" >> beam.ParDo(_KeepSmallestKey(self._root))
            | "SplitCopies" >> SplitRejects()
        )
