"""``Error``: the one root of every error evenshard raises, and its built-in kinds.

Each package exports it (``schemas.Error``, ``reader.Error``, ``convert_core.Error``,
``beam_jobs.Error``, ``audit.Error``), so a caller catches all of the project's errors
with one ``except``. Each error class keeps its built-in base too (``class
DatasetError(Error, ValueError)``): code that catches ``ValueError`` still catches it.
Where evenshard raises a built-in kind of error (a wrong argument, a missing file), it
raises the subclass of it below (``InvalidValueError`` is an ``Error`` and a
``ValueError``), so that too is caught by ``except reader.Error`` and by ``except
ValueError`` alike (``tests/test_errors.py`` checks that no module raises a bare built-in one).
"""

from __future__ import annotations


class Error(Exception):
    """The base class of every exception evenshard raises."""


class InvalidValueError(Error, ValueError):
    """A value evenshard cannot use: an argument, an option, a file's content."""


class InvalidTypeError(Error, TypeError):
    """A value of a type evenshard cannot use."""


class OperationError(Error, RuntimeError):
    """An operation that cannot go on: a worker lost, a state that does not fit."""


class MissingFileError(Error, FileNotFoundError):
    """A file or folder evenshard needs is not there."""


class StorageError(Error, OSError):
    """A file that cannot be read or written as evenshard needs it."""
