"""``Error``: the one root of every error evenshard raises.

Each package exports it (``schemas.Error``, ``reader.Error``, ``beam_jobs.Error``,
``audit.Error``), so a caller catches all of the project's errors with one ``except``.
Each error class keeps its built-in base too (``class DatasetError(Error, ValueError)``):
code that catches ``ValueError`` still catches it.
"""

from __future__ import annotations


class Error(Exception):
    """The base class of every exception evenshard raises."""
