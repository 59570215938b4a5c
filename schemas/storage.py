"""Reading files of a dataset: local paths with Python's own IO, gs:// and s3://
with their stores' clients (``schemas.stores``), other URLs with ``tf.io.gfile``.

The reading side (reader, validate, inspect) goes through here, and convert's
lock on its output folder (``create_new``, ``remove_if``); the rest of the
writing side (``beam_jobs``) goes through Beam's FileSystems. Training never imports
Beam, and ``inspect`` of a local folder imports neither Beam nor TensorFlow.
gs:// goes through google-cloud-storage, not TensorFlow's GCS client, because
it honours ``STORAGE_EMULATOR_HOST`` (a GCS API server on loopback: the tests
run every gs:// path against one) and says what failed in one line.
"""

from __future__ import annotations

import contextlib
import os
import sys

from schemas import stores
from schemas.errors import InvalidValueError


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


def gcs_client():
    """The google-cloud-storage client gs:// is read with (``schemas.stores.GCS``)."""
    return stores.GCS.client()


def open_binary(path: str):
    """A binary stream of the file's stored bytes (never decompressed); seekable."""
    if store := stores.store(path):
        return store.open(path)
    if is_url(path):
        return _gfile().GFile(path, "rb")
    return open(path, "rb")


def download(path: str, out) -> None:
    """Writes the file's stored bytes to ``out`` (anything with ``write``): from a
    bucket in one request, no checksum of the client's (callers check their own)."""
    if store := stores.store(path):
        return store.download(path, out)
    with open_binary(path) as src:
        while chunk := src.read(1 << 22):
            out.write(chunk)


def read_range(path: str, size: int, start: int = 0) -> bytes:
    """Up to ``size`` bytes from ``start`` (from a bucket: one ranged request)."""
    if store := stores.store(path):
        return store.read(path, size, start)
    with open_binary(path) as f:
        f.seek(start)
        return f.read(size)


def read_bytes(path: str) -> bytes:
    if store := stores.store(path):
        return store.read(path)
    with open_binary(path) as f:
        return f.read()


def exists(path: str) -> bool:
    """A file, or a folder (a prefix of objects in a bucket)."""
    if store := stores.store(path):
        return store.is_object(path) or isdir(path)
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    if store := stores.store(path):
        keys, prefixes = store.list(path, limit=1)
        return bool(keys or prefixes)
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    if store := stores.store(path):
        return store.size(path)
    return _gfile().stat(path).length if is_url(path) else os.stat(path).st_size


def listdir(path: str) -> list[str]:
    """Names in a folder (not recursive), sorted."""
    if store := stores.store(path):
        prefix = stores.prefix_of(stores.split(path)[1])
        keys, prefixes = store.list(path)
        names = [k[len(prefix) :] for k in keys] + [p[len(prefix) :].rstrip("/") for p in prefixes]
        return sorted(n for n in names if n)
    return sorted(_gfile().listdir(path) if is_url(path) else os.listdir(path))


def put(path: str, data: bytes) -> None:
    """Writes an object of a bucket (gs://, s3://) in one request: all or nothing."""
    store = stores.store(path)
    if store is None:
        raise InvalidValueError(f"{path}: put writes objects of a bucket only")
    store.put(path, data)


def can_create_new(path: str) -> bool:
    """Whether ``create_new`` works here: local paths, gs:// and s3://."""
    return stores.store(path) is not None or not is_url(path)


def create_new(path: str, data: bytes):
    """Writes a file only if there is none, in one step (local: ``O_EXCL``; a bucket: a
    conditional write, ``schemas.stores``); returns its token, for ``remove_if``.

    Raises:
        FileExistsError: a file is there.
    """
    if store := stores.store(path):
        return store.create_new(path, data)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        return os.fstat(f.fileno()).st_ino


def read_versioned(path: str) -> tuple[bytes, object]:
    """The file's bytes and its token (for ``remove_if``)."""
    if store := stores.store(path):
        return store.read_versioned(path)
    with open(path, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_ino


def remove_if(path: str, token) -> bool:
    """Removes the file if it is still the one of that token; False if it is not
    (replaced, or gone). A bucket checks and removes in one step; a local file is
    checked by its inode, then removed."""
    if store := stores.store(path):
        return store.remove_if(path, token)
    try:
        if os.stat(path).st_ino != token:
            return False
        os.remove(path)
    except FileNotFoundError:
        return False
    return True
