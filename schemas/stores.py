"""Object stores behind ``schemas.storage``: gs:// (google-cloud-storage) and s3:// (boto3).

Each store reads, lists and conditionally writes the objects of URLs, and says
what failed in one line naming the URL (a missing bucket or object, access
denied, no network). Both honour a server on loopback: google-cloud-storage
``STORAGE_EMULATOR_HOST``, boto3 ``AWS_ENDPOINT_URL`` (the tests run every
gs:// and s3:// path against one). With no credentials, a store reads
anonymously (public buckets only) after one warning line.

Conditional writes, for convert's lock on its output folder: GCS's
``ifGenerationMatch`` (0: create only if absent; a generation: delete only
that one), S3's ``If-None-Match: *`` on a put and ``If-Match: ETAG`` on a
delete. The token ``create_new`` returns is the generation, or the ETag.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os

from schemas.errors import MissingFileError, StorageError

log = logging.getLogger(__name__)


def split(url: str) -> tuple[str, str]:
    """(bucket, key) of ``scheme://bucket/key``."""
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key


def prefix_of(key: str) -> str:
    """The listing prefix of a folder's key ("" for the bucket's top)."""
    return key.rstrip("/") + "/" if key.strip("/") else ""


class GCS:
    """gs:// through google-cloud-storage."""

    _client = None

    @classmethod
    def client(cls):
        """The emulator at ``STORAGE_EMULATOR_HOST`` (anonymous), else the default
        credentials; with none, anonymous (public buckets only) and one warning."""
        if cls._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage as gcs

            if os.environ.get("STORAGE_EMULATOR_HOST"):
                cls._client = gcs.Client(project="evenshard", credentials=AnonymousCredentials())
            else:
                try:
                    cls._client = gcs.Client()
                except OSError:  # credentials, but no project: a bucket's objects need none
                    cls._client = gcs.Client(project=None)
                except DefaultCredentialsError:
                    log.warning(
                        "evenshard: no Google Cloud credentials found, reading gs:// "
                        "anonymously (public buckets only); `gcloud auth "
                        "application-default login` uses yours"
                    )
                    cls._client = gcs.Client.create_anonymous_client()
        return cls._client

    def _blob(self, url: str):
        bucket, key = split(url)
        return self.client().bucket(bucket).blob(key)

    @contextlib.contextmanager
    def errors(self, url: str):
        """The client's errors as one-line OSErrors naming the URL."""
        from google.api_core import exceptions
        from requests.exceptions import RequestException

        try:
            yield
        except exceptions.NotFound:
            bucket = split(url)[0]
            if not self.client().bucket(bucket).exists():
                raise MissingFileError(f"{url}: bucket gs://{bucket} does not exist") from None
            raise MissingFileError(f"{url} does not exist") from None
        except exceptions.Forbidden as e:
            raise PermissionError(f"{url}: access denied (403: {e.message})") from None
        except exceptions.GoogleAPICallError as e:
            raise StorageError(f"{url}: Google Cloud Storage error {e.code}: {e.message}") from None
        except (RequestException, exceptions.RetryError) as e:
            reason = type(e).__name__
            raise StorageError(f"{url}: cannot reach Google Cloud Storage ({reason})") from None

    def open(self, url: str):
        blob = self._blob(url)
        with self.errors(url):
            blob.reload()  # a missing object or bucket is said here, not on the first read
        return blob.open("rb", chunk_size=1 << 22)

    def read(self, url: str, size: int | None = None, start: int = 0) -> bytes:
        """The object's bytes; with ``size``, up to that many from ``start`` (one
        ranged request)."""
        with self.errors(url):
            if size is None:
                return self._blob(url).download_as_bytes()
            return self._blob(url).download_as_bytes(
                start=start, end=start + size - 1, checksum=None, raw_download=True
            )

    def download(self, url: str, out) -> None:
        with self.errors(url):
            self._blob(url).download_to_file(out, checksum=None, raw_download=True)

    def size(self, url: str) -> int:
        blob = self._blob(url)
        with self.errors(url):
            blob.reload()
        return blob.size

    def is_object(self, url: str) -> bool:
        with self.errors(url):
            return self._blob(url).exists()

    def list(self, url: str, limit: int | None = None) -> tuple[list[str], list[str]]:
        """(object keys, sub-folder prefixes) directly in the folder ``url``."""
        bucket, key = split(url)
        with self.errors(url):
            found = self.client().list_blobs(
                bucket, prefix=prefix_of(key), delimiter="/", max_results=limit
            )
            return [b.name for b in found], list(found.prefixes)

    def walk(self, url: str):
        """(URL, size) of every object whose URL starts with ``url``, by key."""
        bucket, key = split(url)
        with self.errors(url):
            for blob in self.client().list_blobs(bucket, prefix=key):
                yield f"gs://{bucket}/{blob.name}", int(blob.size)

    def put(self, url: str, data: bytes) -> None:
        with self.errors(url):
            self._blob(url).upload_from_string(data)

    def upload(self, url: str, stream, size: int) -> None:
        """Writes the object of ``size`` bytes from a readable stream at its start: one
        request up to 8 MB, a resumable upload above."""
        with self.errors(url):
            self._blob(url).upload_from_file(stream, size=size)

    def delete(self, url: str) -> None:
        """Removes the object; a missing one is no error."""
        from google.api_core import exceptions

        with self.errors(url), contextlib.suppress(exceptions.NotFound):
            self._blob(url).delete()

    def create_new(self, url: str, data: bytes):
        from google.api_core import exceptions

        blob = self._blob(url)
        with self.errors(url):
            try:
                blob.upload_from_string(data, if_generation_match=0)
            except exceptions.PreconditionFailed:
                raise FileExistsError(f"{url} exists") from None
        return int(blob.generation)

    def read_versioned(self, url: str) -> tuple[bytes, int]:
        blob = self._blob(url)
        with self.errors(url):
            blob.reload()
            generation = int(blob.generation)
            return blob.download_as_bytes(if_generation_match=generation), generation

    def remove_if(self, url: str, generation) -> bool:
        from google.api_core import exceptions

        with self.errors(url):
            try:
                self._blob(url).delete(if_generation_match=generation)
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                return False
        return True


class S3:
    """s3:// through boto3 (``pip install boto3``)."""

    _client = None

    @classmethod
    def client(cls):
        """boto3's default credentials and endpoint (``AWS_ENDPOINT_URL``); with no
        credentials, unsigned requests (public buckets only) and one warning."""
        if cls._client is None:
            try:
                import boto3
                from botocore import UNSIGNED
                from botocore.config import Config
            except ImportError as e:
                raise ImportError(f"s3:// needs boto3: pip install boto3 ({e})") from None
            session = boto3.session.Session()
            if session.get_credentials() is None:
                log.warning(
                    "evenshard: no AWS credentials found, reading s3:// anonymously (public "
                    "buckets only); `aws configure` sets yours"
                )
                cls._client = session.client("s3", config=Config(signature_version=UNSIGNED))
            else:
                cls._client = session.client("s3")
        return cls._client

    @contextlib.contextmanager
    def errors(self, url: str):
        """boto3's errors as one-line OSErrors naming the URL."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket", "NoSuchKey", "404", "NotFound") or status == 404:
                bucket = split(url)[0]
                if code == "NoSuchBucket" or not self._bucket_exists(bucket):
                    raise MissingFileError(f"{url}: bucket s3://{bucket} does not exist") from None
                raise MissingFileError(f"{url} does not exist") from None
            if code in ("AccessDenied", "403", "Forbidden") or status == 403:
                raise PermissionError(f"{url}: access denied (403: {code})") from None
            raise StorageError(f"{url}: S3 error {status}: {code}") from None
        except BotoCoreError as e:
            raise StorageError(f"{url}: cannot reach S3 ({type(e).__name__})") from None

    def _bucket_exists(self, bucket: str) -> bool:
        """Whether the bucket is there (a HEAD of a missing object cannot say)."""
        from botocore.exceptions import ClientError

        try:
            self.client().head_bucket(Bucket=bucket)
        except ClientError as e:
            return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404
        return True

    def _get(self, url: str, first: int | None = None, last: int | None = None):
        bucket, key = split(url)
        ranged = {} if first is None else {"Range": f"bytes={first}-{last}"}
        return self.client().get_object(Bucket=bucket, Key=key, **ranged)

    def open(self, url: str):
        return io.BufferedReader(_Ranged(url, self.size(url), self), buffer_size=1 << 22)

    def read(self, url: str, size: int | None = None, start: int = 0) -> bytes:
        with self.errors(url):
            try:
                ranged = (start, start + size - 1) if size else ()
                return self._get(url, *ranged)["Body"].read()
            except Exception as e:  # an empty object has no byte 0
                if getattr(e, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise

    def download(self, url: str, out) -> None:
        with self.errors(url):
            body = self._get(url)["Body"]
            while chunk := body.read(1 << 22):
                out.write(chunk)

    def size(self, url: str) -> int:
        bucket, key = split(url)
        with self.errors(url):
            return int(self.client().head_object(Bucket=bucket, Key=key)["ContentLength"])

    def is_object(self, url: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split(url)
        with self.errors(url):
            try:
                self.client().head_object(Bucket=bucket, Key=key)
            except ClientError as e:
                if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return False  # a missing bucket is said by the listing that follows
                raise
        return True

    def list(self, url: str, limit: int | None = None) -> tuple[list[str], list[str]]:
        bucket, key = split(url)
        keys, prefixes = [], []
        with self.errors(url):
            pages = (
                self.client()
                .get_paginator("list_objects_v2")
                .paginate(
                    Bucket=bucket,
                    Prefix=prefix_of(key),
                    Delimiter="/",
                    PaginationConfig={"MaxItems": limit} if limit else {},
                )
            )
            for page in pages:
                keys += [o["Key"] for o in page.get("Contents", [])]
                prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return keys, prefixes

    def walk(self, url: str):
        """(URL, size) of every object whose URL starts with ``url``, by key."""
        bucket, key = split(url)
        with self.errors(url):
            pages = (
                self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key)
            )
            for page in pages:
                for found in page.get("Contents", []):
                    yield f"s3://{bucket}/{found['Key']}", int(found["Size"])

    def put(self, url: str, data: bytes) -> None:
        bucket, key = split(url)
        with self.errors(url):
            self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def upload(self, url: str, stream, size: int) -> None:
        """Writes the object from a readable stream at its start: one put up to 8 MB,
        a multipart upload above (``size``: unused, boto3 finds it)."""
        bucket, key = split(url)
        with self.errors(url):
            self.client().upload_fileobj(stream, bucket, key)

    def delete(self, url: str) -> None:
        """Removes the object; a missing one is no error (S3 says none)."""
        bucket, key = split(url)
        with self.errors(url):
            self.client().delete_object(Bucket=bucket, Key=key)

    def create_new(self, url: str, data: bytes) -> str:
        bucket, key = split(url)
        with self.errors(url):
            try:
                put = self.client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except Exception as e:
                if _code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise FileExistsError(f"{url} exists") from None
                raise
        return put["ETag"]

    def read_versioned(self, url: str) -> tuple[bytes, str]:
        with self.errors(url):
            got = self._get(url)
            return got["Body"].read(), got["ETag"]

    def remove_if(self, url: str, etag) -> bool:
        bucket, key = split(url)
        with self.errors(url):
            try:
                self.client().delete_object(Bucket=bucket, Key=key, IfMatch=etag)
            except Exception as e:
                if _code(e) in ("PreconditionFailed", "NoSuchKey", "404"):
                    return False
                raise
        return True


def _code(error: BaseException) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


class _Ranged(io.RawIOBase):
    """A seekable read-only stream of an S3 object, by ranged requests."""

    def __init__(self, url: str, size: int, store: S3):
        self.url, self.length, self.store, self.pos = url, size, store, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.length - self.pos)
        if n <= 0:
            return 0
        with self.store.errors(self.url):
            data = self.store._get(self.url, self.pos, self.pos + n - 1)["Body"].read()
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


STORES = {"gs": GCS(), "s3": S3()}


def _forget_clients() -> None:
    """A forked process makes its own clients: a client's connections are not shared."""
    GCS._client = S3._client = None


os.register_at_fork(after_in_child=_forget_clients)
