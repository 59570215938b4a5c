"""Tools that use the format and the reader: check a dataset, describe it, measure its mixing.

``audit.validate`` (``evenshard validate``), ``audit.summary`` (``evenshard
inspect``), ``audit.shuffle_report`` and ``audit.mixing`` (``evenshard
shuffle-report``). They sit above ``schemas`` and ``reader`` and below the CLI;
nothing in the format or the reader depends on them.
"""

from schemas.errors import Error

__all__ = ["Error"]
