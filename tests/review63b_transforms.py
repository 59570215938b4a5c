"""Transforms for tests/test_review63b_*.py (importable by worker processes)."""
import os
import signal
import time


def big_string(example, rng):
    """A 1 MB string an example: the answer is pickled lists, far over a pipe's buffer."""
    return {**example, "blob": "x" * (1 << 20)}


def slow_big_string(example, rng):
    time.sleep(0.01)
    return {**example, "blob": "x" * (1 << 20)}


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def raises_on_third(example, rng):
    if example["epoch"] == 0 and example["key"].endswith("00003.png"):
        raise ValueError("third")
    return example
