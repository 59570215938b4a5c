"""The user's embedding run in the workers (``--near_embedding``): decoded images in,
their stored vectors (``schemas.near_embedding``) out, a batch at a time.

Inspection decodes each image once (``inspect_stream(..., pixels=True)``) and hands
the Image on with its pixels where its fingerprint goes; :class:`Embedder` holds up to
a batch of them and calls the function: with the list (``FUNCTION.batched = True``,
at most ``FUNCTION.batch_size`` images, default 32) or one image at a time, always
from the thread that runs the DoFn (never from inspection's threads: the function
need not be thread-safe). Memory: a batch of decoded images (a JPEG at the DCT scale
that keeps 256 px a side). A batch is whatever the bundle holds, so the vectors must
not depend on the batch (a model in eval mode: no batch statistics); each is
quantised to int8 before it is compared, which hides a last-bit difference but not
a larger one.
"""

from __future__ import annotations

import numpy as np

from convert_core.records import Image
from schemas import near_embedding
from schemas.errors import InvalidValueError


class Embedder:
    """Images with pixels (``Image.near`` an array) -> the same Images with their stored
    vector's hex in ``near``; anything else passes as it is."""

    def __init__(self, spec: str):
        self._spec = spec
        self._fn = None
        self._pending: list[Image] = []

    def setup(self) -> None:
        self._fn = near_embedding.load(self._spec)
        self._batched = bool(getattr(self._fn, "batched", False))
        self._size = max(1, int(getattr(self._fn, "batch_size", near_embedding.BATCH_SIZE)))

    def add(self, item) -> list:
        """What is ready once ``item`` (an Image, a Reject) is taken in: itself, or the
        batch it completes, embedded."""
        if not isinstance(item, Image) or not isinstance(item.near, np.ndarray):
            return [item]
        self._pending.append(item)
        return self.flush() if len(self._pending) >= self._size else []

    def _called(self, pixels, key: str, batch: int = 0):
        """The user's function on an image (or a batch of ``batch`` from ``key``): what
        it raises is one line naming it and the image, not Beam's traceback."""
        try:
            return self._fn(pixels)
        except Exception as e:
            where = f"a batch of {batch} images from {key}" if batch else key
            raise InvalidValueError(
                f"--near_embedding {self._spec} raised {type(e).__name__} for {where}: {e}"
            ) from e

    def flush(self) -> list[Image]:
        """The Images held, embedded."""
        batch, self._pending = self._pending, []
        if not batch:
            return []
        if self._batched:
            vectors = self._called([im.near for im in batch], batch[0].key, len(batch))
            if not hasattr(vectors, "__len__"):
                raise InvalidValueError(
                    f"--near_embedding {self._spec} gave a {type(vectors).__name__} for a "
                    f"batch of {len(batch)} images (the first {batch[0].key}): a batched "
                    "function returns an array or a list, one row an image"
                )
            if len(vectors) != len(batch):
                raise InvalidValueError(
                    f"--near_embedding {self._spec} gave {len(vectors)} vectors for a batch of "
                    f"{len(batch)} images (the first {batch[0].key}): a batched function "
                    "gives one row an image"
                )
        else:
            vectors = [self._called(im.near, im.key) for im in batch]
        return [
            im._replace(near=near_embedding.quantised(v, self._spec, im.key).tobytes().hex())
            for im, v in zip(batch, vectors)
        ]
