"""Convert's core: plain, typed functions of each step, without Apache Beam.

``beam_jobs`` runs them as Beam transforms, one a step, over workers; the tests'
in-process writer (``tests/dataset_writing.py``) runs the same functions in one
process. Nothing here imports ``apache_beam`` (``tests/test_layers.py``): URLs
other than a bucket's objects are read through the file system a caller gives
(``convert_core.files``).
"""

from schemas.errors import Error

__all__ = ["Error"]
