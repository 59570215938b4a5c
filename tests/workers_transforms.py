"""Transforms for tests/test_workers.py (importable by worker processes)."""

import time


def slow_big_string(example, rng):
    """A 1 MB string an example: the answer is pickled lists, far over a pipe's buffer."""
    time.sleep(0.01)
    return {**example, "blob": "x" * (1 << 20)}
