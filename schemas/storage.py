"""Reading files of a dataset: local paths with Python's own IO, gs:// with
google-cloud-storage, other URLs with ``tf.io.gfile``.

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
import logging
import os
import sys

log = logging.getLogger(__name__)


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


# --- gs:// through google-cloud-storage: it honours STORAGE_EMULATOR_HOST (a GCS API
# server on loopback, as the tests run), which TensorFlow's own GCS client does not.
_client = None


def gcs_client():
    """The GCS client: the emulator at ``STORAGE_EMULATOR_HOST`` (anonymous), else the
    default credentials; with none, anonymous (public buckets only) and one warning."""
    global _client
    if _client is None:
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage as gcs

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            _client = gcs.Client(project="evenshard", credentials=AnonymousCredentials())
        else:
            try:
                _client = gcs.Client()
            except (DefaultCredentialsError, OSError):
                log.warning(
                    "evenshard: no Google Cloud credentials found, reading gs:// anonymously "
                    "(public buckets only); `gcloud auth application-default login` uses yours"
                )
                _client = gcs.Client.create_anonymous_client()
    return _client


def _blob(url: str):
    bucket, _, name = url[len("gs://") :].partition("/")
    return gcs_client().bucket(bucket).blob(name)


@contextlib.contextmanager
def _gcs_errors(url: str):
    """The client's errors as one-line OSErrors naming the URL."""
    from google.api_core import exceptions
    from requests.exceptions import RequestException

    try:
        yield
    except exceptions.NotFound:
        bucket = url[len("gs://") :].split("/", 1)[0]
        if not gcs_client().bucket(bucket).exists():
            raise FileNotFoundError(f"{url}: bucket gs://{bucket} does not exist") from None
        raise FileNotFoundError(f"{url} does not exist") from None
    except exceptions.Forbidden as e:
        raise PermissionError(f"{url}: access denied (403: {e.message})") from None
    except exceptions.GoogleAPICallError as e:
        raise OSError(f"{url}: Google Cloud Storage error {e.code}: {e.message}") from None
    except (RequestException, exceptions.RetryError) as e:
        raise OSError(f"{url}: cannot reach Google Cloud Storage ({type(e).__name__})") from None


def _is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def open_binary(path: str):
    """A binary stream of the file's stored bytes (never decompressed); seekable."""
    if _is_gcs(path):
        blob = _blob(path)
        with _gcs_errors(path):
            blob.reload()  # a missing object or bucket is said here, not on the first read
        return blob.open("rb", chunk_size=1 << 22)
    if is_url(path):
        return _gfile().GFile(path, "rb")
    return open(path, "rb")


def download(path: str, out) -> None:
    """Writes the file's stored bytes to ``out`` (anything with ``write``): gs:// in one
    request, no checksum of the client's (callers check their own)."""
    if _is_gcs(path):
        with _gcs_errors(path):
            _blob(path).download_to_file(out, checksum=None, raw_download=True)
        return
    with open_binary(path) as src:
        while chunk := src.read(1 << 22):
            out.write(chunk)


def read_head(path: str, size: int) -> bytes:
    """Up to ``size`` bytes from the file's start (gs://: one ranged request)."""
    if _is_gcs(path):
        with _gcs_errors(path):
            return _blob(path).download_as_bytes(
                start=0, end=size - 1, checksum=None, raw_download=True
            )
    with open_binary(path) as f:
        return f.read(size)


def read_bytes(path: str) -> bytes:
    if _is_gcs(path):
        with _gcs_errors(path):
            return _blob(path).download_as_bytes()
    with open_binary(path) as f:
        return f.read()


def exists(path: str) -> bool:
    """A file, or a folder (a prefix of objects on gs://)."""
    if _is_gcs(path):
        with _gcs_errors(path):
            return _blob(path).exists() or isdir(path)
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    if _is_gcs(path):
        bucket, _, name = path[len("gs://") :].partition("/")
        prefix = name.rstrip("/") + "/" if name.strip("/") else ""
        with _gcs_errors(path):
            return any(True for _ in gcs_client().list_blobs(bucket, prefix=prefix, max_results=1))
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def size(path: str) -> int:
    if _is_gcs(path):
        blob = _blob(path)
        with _gcs_errors(path):
            blob.reload()
        return blob.size
    return _gfile().stat(path).length if is_url(path) else os.stat(path).st_size


def listdir(path: str) -> list[str]:
    """Names in a folder (not recursive), sorted."""
    if _is_gcs(path):
        bucket, _, name = path[len("gs://") :].partition("/")
        prefix = name.rstrip("/") + "/" if name.strip("/") else ""
        with _gcs_errors(path):
            found = gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/")
            names = [b.name[len(prefix) :] for b in found]
            names += [p[len(prefix) :].rstrip("/") for p in found.prefixes]
        return sorted(n for n in names if n)
    return sorted(_gfile().listdir(path) if is_url(path) else os.listdir(path))


def can_create_new(path: str) -> bool:
    """Whether ``create_new`` works here: local paths and gs://."""
    return _is_gcs(path) or not is_url(path)


def create_new(path: str, data: bytes) -> int:
    """Writes a file only if there is none, in one step (local: ``O_EXCL``; gs://: the
    ``ifGenerationMatch=0`` precondition); returns its generation, for ``remove_if``.

    Raises:
        FileExistsError: a file is there.
    """
    if _is_gcs(path):
        from google.api_core import exceptions

        blob = _blob(path)
        with _gcs_errors(path):
            try:
                blob.upload_from_string(data, if_generation_match=0)
            except exceptions.PreconditionFailed:
                raise FileExistsError(f"{path} exists") from None
        return int(blob.generation)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        return os.fstat(f.fileno()).st_ino


def read_versioned(path: str) -> tuple[bytes, int]:
    """The file's bytes and its generation (for ``remove_if``)."""
    if _is_gcs(path):
        blob = _blob(path)
        with _gcs_errors(path):
            blob.reload()
            generation = int(blob.generation)
            return blob.download_as_bytes(if_generation_match=generation), generation
    with open(path, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_ino


def remove_if(path: str, generation: int) -> bool:
    """Removes the file if it is still the one of that generation; False if it is not
    (replaced, or gone). gs:// checks and removes in one step; a local file is checked
    by its inode, then removed."""
    if _is_gcs(path):
        from google.api_core import exceptions

        with _gcs_errors(path):
            try:
                _blob(path).delete(if_generation_match=generation)
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                return False
        return True
    try:
        if os.stat(path).st_ino != generation:
            return False
        os.remove(path)
    except FileNotFoundError:
        return False
    return True
