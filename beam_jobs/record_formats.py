"""Which source module reads each ``--input_format``: the one registry of record formats.

Apart from ``record_source.py`` (what the formats share, which each source module
imports), so the registry that imports the source modules sits above them and no
import runs in a circle.
"""

from __future__ import annotations

from convert_core.record_rules import RecordFormat


def record_format(name: str) -> RecordFormat:
    """The ``RecordFormat`` of ``--input_format=name``: its source module's ``FORMAT``."""
    if name == "parquet":
        from beam_jobs.parquet_source import FORMAT
    elif name == "webdataset":
        from beam_jobs.webdataset_source import FORMAT
    elif name == "tfds":
        from beam_jobs.tfds_source import FORMAT
    else:
        from beam_jobs.tfrecord_source import FORMAT
    return FORMAT
