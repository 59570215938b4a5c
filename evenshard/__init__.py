"""evenshard: image folders and manifests to globally shuffled, split, balanced TFRecord shards.

The packages, bottom up: ``schemas`` (the format), ``convert_core`` (convert's steps as
plain functions) and ``reader`` (reads the format), ``beam_jobs`` (runs convert's steps
with Beam: writes it); this package holds the ``evenshard`` command on top
(``evenshard.cli``) and generated sample images (``evenshard.synthetic``).
"""

__version__ = "0.1.0"
