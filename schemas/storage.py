"""The one way to files: local paths with Python's own IO, gs:// and s3:// with their
stores' clients (``schemas.stores``: one client a process, reused), and, for reading
only, other URLs with ``tf.io.gfile``.

Everything goes through here: convert's inputs, shards, rejects, description and
the lock on its output folder, the readers and their cache, validate and inspect.
Beam's FileSystems are left to Beam (its temp and staging folders). Training never
imports Beam, and ``inspect`` of a local folder imports neither Beam nor TensorFlow.
gs:// goes through google-cloud-storage, not TensorFlow's GCS client, because
it honours ``STORAGE_EMULATOR_HOST`` (a GCS API server on loopback: the tests
run every gs:// path against one) and says what failed in one line.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import sys
import tempfile
import uuid

from schemas import layout, stores
from schemas.errors import InvalidValueError
from schemas.layout import is_url  # noqa: F401 - storage.is_url, as callers know it


def store_of(path: str):
    """The object store of a URL (gs://, s3://: ``schemas.stores``), or None."""
    scheme, sep, _ = path.partition("://")
    return stores.STORES.get(scheme) if sep else None


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
    if store := store_of(path):
        return store.open(path)
    if is_url(path):
        return _gfile().GFile(path, "rb")
    return open(path, "rb")


def download(path: str, out) -> None:
    """Writes the file's stored bytes to ``out`` (anything with ``write``): from a
    bucket in one request, no checksum of the client's (callers check their own)."""
    if store := store_of(path):
        return store.download(path, out)
    with open_binary(path) as src:
        while chunk := src.read(1 << 22):
            out.write(chunk)


def read_range(path: str, size: int, start: int = 0) -> bytes:
    """Up to ``size`` bytes from ``start``: from a bucket in one ranged request; a local
    file with ``os.pread`` (no buffered reader, no fstat or isatty of its own: half the
    time of ``open(path, "rb")`` on small images, 5 against 10 us)."""
    if store := store_of(path):
        return store.read(path, size, start)
    if is_url(path):
        with open_binary(path) as f:
            f.seek(start)
            return f.read(size)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = []
        while size > 0 and (chunk := os.pread(fd, size, start)):
            chunks.append(chunk)
            size, start = size - len(chunk), start + len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def open_text(path: str, errors: str = "strict") -> io.TextIOBase:
    """A text stream of a manifest or labels file; ``.gz`` files are gunzipped.

    ``errors="surrogateescape"`` keeps bytes that are not UTF-8 as lone surrogates,
    which convert's row checks reject (``bad_path``, ``bad_label``) row by row.
    """
    raw = open_binary(path)
    if path.lower().endswith(".gz"):
        raw = gzip.GzipFile(fileobj=raw, mode="rb")
    # utf-8-sig drops a BOM; newline="" lets csv handle CRLF line ends.
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors=errors, newline="")


def read_bytes(path: str) -> bytes:
    if store := store_of(path):
        return store.read(path)
    with open_binary(path) as f:
        return f.read()


def exists(path: str) -> bool:
    """A file, or a folder (a prefix of objects in a bucket)."""
    if store := store_of(path):
        return store.is_object(path) or isdir(path)
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    if store := store_of(path):
        keys, prefixes = store.list(path, limit=1)
        return bool(keys or prefixes)
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    if store := store_of(path):
        return store.size(path)
    return _gfile().stat(path).length if is_url(path) else os.stat(path).st_size


def listdir(path: str) -> list[str]:
    """Names in a folder (not recursive), sorted."""
    if store := store_of(path):
        prefix = stores.prefix_of(stores.split(path)[1])
        keys, prefixes = store.list(path)
        names = [k[len(prefix) :] for k in keys] + [p[len(prefix) :].rstrip("/") for p in prefixes]
        return sorted(n for n in names if n)
    return sorted(_gfile().listdir(path) if is_url(path) else os.listdir(path))


def put(path: str, data: bytes) -> None:
    """Writes an object of a bucket (gs://, s3://) in one request: all or nothing."""
    store = store_of(path)
    if store is None:
        raise InvalidValueError(f"{path}: put writes objects of a bucket only")
    store.put(path, data)


def create_new(path: str, data: bytes):
    """Writes a file only if there is none, in one step (local: ``O_EXCL``; a bucket: a
    conditional write, ``schemas.stores``); returns its token, for ``remove_if``.

    Raises:
        FileExistsError: a file is there.
    """
    if store := store_of(path):
        return store.create_new(path, data)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        return os.fstat(f.fileno()).st_ino


def read_versioned(path: str) -> tuple[bytes, object]:
    """The file's bytes and its token (for ``remove_if``)."""
    if store := store_of(path):
        return store.read_versioned(path)
    with open(path, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_ino


def remove_if(path: str, token) -> bool:
    """Removes the file if it is still the one of that token; False if it is not
    (replaced, or gone). A bucket checks and removes in one step; a local file is
    checked by its inode, then removed."""
    if store := store_of(path):
        return store.remove_if(path, token)
    try:
        if os.stat(path).st_ino != token:
            return False
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


# -- writing (local paths and buckets) and listing by glob

SPOOL_BYTES = 1 << 24  # a bucket object is written from memory up to this, then from disk


def _writes(path: str) -> None:
    if is_url(path) and store_of(path) is None:
        raise InvalidValueError(f"{path}: evenshard writes local paths, gs:// and s3:// only")


@contextlib.contextmanager
def writer(path: str, temp_dir: str | None = None):
    """A binary stream whose bytes become the file ``path`` whole when the block ends
    without an error, and never in part: a local file is written to a unique temp name
    (in ``temp_dir``, else beside it) and renamed into place; a bucket's object is one
    upload (spooled to disk past ``SPOOL_BYTES``). A block that raises leaves nothing."""
    _writes(path)
    if store := store_of(path):
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as spool:
            yield spool
            size = spool.tell()
            spool.seek(0)
            store.upload(path, spool, size)
        return
    name = os.path.basename(path)
    tmp = layout.temp_name(os.path.join(temp_dir, name) if temp_dir else path, uuid.uuid4().hex)
    os.makedirs(os.path.dirname(os.path.abspath(tmp)), exist_ok=True)
    try:
        with open(tmp, "wb") as f:
            yield f
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def write_atomically(path: str, data: bytes) -> None:
    """Writes the file whole or not at all (``writer``)."""
    with writer(path) as f:
        f.write(data)


def delete(paths) -> None:
    """Removes files (a local folder with what it holds); missing ones are no error."""
    for path in paths:
        _writes(path)
        if store := store_of(path):
            store.delete(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):  # any other failure is said
                shutil.rmtree(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def files_under(folder: str) -> list[str]:
    """What removing ``folder`` takes (``delete``): a local folder itself, where it is; a
    bucket's objects under its prefix (a bucket has no folders)."""
    if store_of(folder):
        return [p for p, _ in match("**", folder=folder)]
    return [folder] if os.path.exists(folder) else []


GLOB_CHARS = "*?["


def match(pattern: str, limit: int | None = None, folder: str = "") -> list[tuple[str, int]]:
    """(path, size in bytes) of each file ``pattern`` matches, sorted; with ``limit``, the
    first that many found (in a fixed order).

    A shell's rules, local and in a bucket alike (those of Beam's FileSystems.match
    for patterns convert is given: tests/test_storage.py): ``*`` and ``?`` match
    within one name, ``**`` across folders, ``[...]`` is a class (``[!...]`` its
    complement); a pattern without them names one file (or none). A local folder's
    symlinks to folders are not followed. ``folder``: ``pattern`` is relative to it,
    and its own name is no pattern (``*``, ``?`` and ``[`` in it are themselves).
    """
    prefix = folder.rstrip("/") + "/" if folder else ""
    full = prefix + pattern
    _writes(full)
    cut = len(prefix) + min(
        (pattern.find(c) for c in GLOB_CHARS if c in pattern), default=len(pattern)
    )
    static = full[:cut]
    rule = re.compile(re.escape(prefix) + _glob_rule(pattern).pattern)
    if store := store_of(full):
        listed = store.walk(static)
    else:
        listed = _local_files(static, full[cut:])
    found = []
    for path, n in listed:
        if rule.fullmatch(path):
            found.append((path, n))
            if limit and len(found) >= limit:
                break
    return sorted(found)


def _local_files(static: str, rest: str):
    """(path, size) of the local files a pattern of ``static`` + ``rest`` may match, in
    folders no deeper than ``rest`` reaches (unbounded with ``**``)."""
    if not rest:
        with contextlib.suppress(OSError):
            if os.path.isfile(static):
                yield static, os.path.getsize(static)
        return
    base = static[: static.rfind("/") + 1]
    depth = None if "**" in rest else (static[len(base) :] + rest).count("/")
    top = base or "."
    for folder, dirs, files in os.walk(top):
        rel = os.path.relpath(folder, top)
        prefix = base if rel == "." else f"{base}{rel}/"
        dirs.sort()
        if depth is not None and (0 if rel == "." else rel.count("/") + 1) >= depth:
            dirs[:] = []
        for name in sorted(files):
            with contextlib.suppress(OSError):
                yield prefix + name, os.path.getsize(prefix + name)


def _glob_rule(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        end = pattern.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif end > 0:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))
