"""Reading files of a dataset: local paths with Python's own IO, URLs with ``tf.io.gfile``.

The reading side (reader, validate, inspect) goes through here; the writing
side (``beam_jobs``) goes through Beam's FileSystems. Training never imports
Beam, and ``inspect`` of a local folder imports neither Beam nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import sys


def is_url(path: str) -> bool:
    return "://" in path


def tensorflow():
    """TensorFlow, imported without the lines its C++ core prints at start.

    On a machine without a GPU, TensorFlow's import prints absl and CUDA
    lines ("Could not find cuda drivers", "failed call to cuInit") straight
    to the process's stderr, below Python. The import runs with file
    descriptor 2 pointed at /dev/null (Python errors still raise), and
    ``TF_CPP_MIN_LOG_LEVEL`` defaults to 3 so the runtime's own start-up
    errors stay quiet too; set it yourself to see them.
    """
    global _tensorflow_started
    if not _tensorflow_started:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with _quiet_fd2():
            import tensorflow

            # The runtime starts (and calls cuInit) on the first device query, here
            # and not on the first op: when JAX or another absl user came first,
            # TF_CPP_MIN_LOG_LEVEL no longer filters its "failed call to cuInit".
            tensorflow.config.list_physical_devices()
        _tensorflow_started = True
    return sys.modules["tensorflow"]


_tensorflow_started = False


@contextlib.contextmanager
def _quiet_fd2():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _gfile():
    return tensorflow().io.gfile


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
