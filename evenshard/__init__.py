"""evenshard: image folders and manifests to globally shuffled, split, balanced TFRecord shards.

The packages, bottom up: ``schemas`` (the format), ``beam_jobs`` (writes it)
and ``reader`` (reads it); this package holds the ``evenshard`` command on top
(``evenshard.cli``) and generated sample images (``evenshard.synthetic``).
"""

__version__ = "0.1.0"
