"""glibc's ``mallopt`` through ctypes, for the processes that tune their heap: convert's
driver and workers (``beam_jobs.runners.lean_malloc``) and the reader's preprocessing
workers (``reader.routes.preprocess_worker``)."""

from __future__ import annotations

import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def mallopt(settings) -> bool:
    """Sets each (parameter, value) of ``settings`` in this process's malloc; False where
    there is no glibc (another platform, another C library) or it refused one."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return all([libc.mallopt(param, value) == 1 for param, value in settings])
    except (OSError, AttributeError):  # another C library, or no mallopt in it
        return False
