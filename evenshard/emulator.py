"""Object-store servers on loopback for the tests and benchmarks: GCS and S3.

GCS (``gcp-storage-emulator``):
``with gcs_emulator() as client:`` starts the server on a free port of 127.0.0.1,
in memory, points ``STORAGE_EMULATOR_HOST`` at it (google-cloud-storage and Beam's
GCS filesystem honour it; TensorFlow's own GCS client does not), and stops it
and restores the variable on leaving.

The server is gcp-storage-emulator's, with two things GCS does that it lacks
(``python -m evenshard.emulator PORT [LOG]`` runs it so):
- requests are served concurrently, as GCS serves them (its own server answers
  one at a time, so a reader's fetches in flight would queue);
- the ``ifGenerationMatch`` precondition, as GCS documents it: a request whose
  object's generation is not the one named (0: no object) is answered 412
  Precondition Failed, and the check and a write are one step. Convert's lock on
  a gs:// output folder is a create-if-absent (``ifGenerationMatch=0``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time


def upload(bucket, local: str, prefix: str) -> str:
    """Copies every file under ``local`` to gs://BUCKET/prefix/...; returns that URL."""
    for folder, _, files in os.walk(local):
        for f in files:
            rel = os.path.relpath(os.path.join(folder, f), local)
            bucket.blob(f"{prefix}/{rel}").upload_from_filename(os.path.join(folder, f))
    return f"gs://{bucket.name}/{prefix}"


@contextlib.contextmanager
def gcs_emulator(log: str | None = None):
    """The server, running; yields a google-cloud-storage client of it. ``log``: a file
    the server appends a line to for each download it answers, ``OBJECT<TAB>BYTES``
    (the benchmarks count egress by it)."""
    from schemas import storage, stores

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "evenshard.emulator", str(port), *([log] if log else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        _wait_for(port, proc, "the GCS emulator")
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        stores.GCS._client = None
        yield storage.gcs_client()
    finally:
        proc.kill()
        proc.wait()
        stores.GCS._client = None
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before


@contextlib.contextmanager
def s3_server():
    """moto's S3 server, running; yields a boto3 client of it."""
    from schemas import stores

    port = _free_port()
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    before = {n: os.environ.get(n) for n in names}
    try:
        _wait_for(port, proc, "the S3 server")
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_DEFAULT_REGION="us-east-1",
        )
        stores.S3._client = None
        yield stores.S3.client()
    finally:
        proc.kill()
        proc.wait()
        stores.S3._client = None
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, proc, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


def _serve(port: int, log: str | None = None) -> None:
    """gcp-storage-emulator on 127.0.0.1:port, in memory, concurrent, with ifGenerationMatch;
    ``log``: each download answered, as a line ``OBJECT<TAB>BYTES`` appended there."""
    import http.server
    import logging
    import threading

    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    logging.disable(logging.CRITICAL)
    writes = threading.Lock()  # a precondition's check and the write it guards: one step
    logged = threading.Lock()  # one line of the log at a time
    reads = {objects.get, objects.download, objects.ls, objects.acl_list}

    def guarded(handler):
        def handle(request, response, storage, *args, **kwargs):
            match = request.query.get("ifGenerationMatch")
            with contextlib.nullcontext() if handler in reads else writes:
                if match is not None:
                    try:
                        obj = storage.get_file_obj(
                            request.params["bucket_name"], _object_name(request)
                        )
                        generation = obj["generation"]
                    except NotFound:
                        generation = "0"
                    if generation != match[0]:
                        response.status = http.HTTPStatus.PRECONDITION_FAILED
                        response.json(
                            {
                                "error": {
                                    "code": 412,
                                    "message": "At least one of the pre-conditions you "
                                    "specified did not hold.",
                                    "errors": [{"reason": "conditionNotMet"}],
                                }
                            }
                        )
                        return None
                answer = handler(request, response, storage, *args, **kwargs)
            ok = response.status in (http.HTTPStatus.OK, http.HTTPStatus.PARTIAL_CONTENT)
            if log and handler is objects.download and ok:  # an error's body is no download
                with logged:
                    with open(log, "a") as f:
                        f.write(f"{_object_name(request)}\t{len(response._content)}\n")
            return answer

        return handle

    server.HANDLERS = tuple(
        (regex, {method: guarded(h) for method, h in handlers.items()})
        for regex, handlers in server.HANDLERS
    )
    objects.insert = guarded(objects.insert)  # the router's fallback for bare upload paths
    http.server.HTTPServer = http.server.ThreadingHTTPServer
    server.create_server("127.0.0.1", port, in_memory=True).run()


def _object_name(request) -> str:
    """The object a JSON API request names: in its path, its query, or an upload's body."""
    if request.params.get("object_id"):
        return request.params["object_id"]
    if "name" in request.query:
        return request.query["name"][0]
    data = request.data
    if isinstance(data, dict):
        return (data.get("meta") or data).get("name", "")
    return ""


if __name__ == "__main__":
    _serve(int(sys.argv[1]), *sys.argv[2:3])
