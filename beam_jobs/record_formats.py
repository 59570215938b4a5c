"""Which source module reads each ``--input_format``: ``convert_core.options.RECORD_FORMATS``
(the one registry of record formats, a table of module names) imported.

Apart from ``record_source.py`` (what the formats share, which each source module
imports), so the registry that imports the source modules sits above them and no
import runs in a circle.
"""

from __future__ import annotations

import importlib

from convert_core.options import RECORD_FORMATS
from convert_core.record_rules import RecordFormat


def record_format(name: str) -> RecordFormat:
    """The ``RecordFormat`` of ``--input_format=name`` (a key of ``RECORD_FORMATS``,
    which ``convert_core.options`` checked): its source module's ``FORMAT``."""
    return importlib.import_module(RECORD_FORMATS[name].module).FORMAT
