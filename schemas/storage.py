"""Reading files of a dataset: local paths with Python's own IO, URLs with ``tf.io.gfile``.

The reading side (reader, validate, inspect) goes through here; the writing
side (``beam_jobs``) goes through Beam's FileSystems. Training never imports
Beam, and ``inspect`` of a local folder imports neither Beam nor TensorFlow.
"""

from __future__ import annotations

import os


def is_url(path: str) -> bool:
    return "://" in path


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def open_binary(path: str):
    """A binary stream of the file's stored bytes (never decompressed)."""
    if is_url(path):
        return _gfile().GFile(path, "rb")
    return open(path, "rb")


def read_bytes(path: str) -> bytes:
    with open_binary(path) as f:
        return f.read()


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    return _gfile().stat(path).length if is_url(path) else os.stat(path).st_size


def listdir(path: str) -> list[str]:
    """Names in a folder (not recursive), sorted."""
    return sorted(_gfile().listdir(path) if is_url(path) else os.listdir(path))
