"""Object-store servers on loopback, GCS and S3: to try buckets on one machine, and the
tests' and benchmarks' buckets. Tooling, in the package so that everything starts
it the same way (docs/design.md, "Object stores"); its servers come with the
``dev`` extra.

``python -m evenshard.emulator gs photos/`` (or ``s3``) starts a server on
127.0.0.1, makes the bucket ``local`` (``--bucket``), uploads the folder to
``gs://local/photos/``, prints the variables that point another shell's clients
(evenshard, the readers, google-cloud-storage and boto3) at it, and serves until
Ctrl-C, which stops it. The objects live in the server's memory and go with it.
Each server ends with the process that started it, however that one ends (a
``kill -9`` or a crash runs no ``finally``): it watches a pipe only that process held.

GCS (``gcp-storage-emulator``):
``with gcs_emulator() as client:`` starts the server on a free port of 127.0.0.1,
in memory, points ``STORAGE_EMULATOR_HOST`` at it (google-cloud-storage and Beam's
GCS filesystem honour it; TensorFlow's own GCS client does not), and stops it
and restores the variable on leaving.

The server is gcp-storage-emulator's, with three things GCS does that it lacks
(``python -m evenshard.emulator serve-gcs PORT [LOG]`` runs it so):
- requests are served concurrently, as GCS serves them (its own server answers
  one at a time, so a reader's fetches in flight would queue);
- the ``ifGenerationMatch`` precondition, as GCS documents it: a request whose
  object's generation is not the one named (0: no object) is answered 412
  Precondition Failed, and the check and a write are one step. Convert's lock on
  a gs:// output folder is a create-if-absent (``ifGenerationMatch=0``);
- a write takes the same time in a full bucket as in an empty one: its own
  serializes every object's metadata again on each write, even in memory (8,813
  uploads stalled after about 5,800 in 10 minutes); in memory that copy is never
  read, so it is not made.

S3: ``with s3_server() as client:`` runs moto's server the same way
(``AWS_ENDPOINT_URL`` and test credentials).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from schemas.errors import OperationError


def upload(bucket, local: str, prefix: str) -> str:
    """Copies every file under ``local`` to gs://BUCKET/prefix/...; returns that URL."""
    for folder, _, files in os.walk(local):
        for f in files:
            rel = os.path.relpath(os.path.join(folder, f), local)
            bucket.blob(f"{prefix}/{rel}").upload_from_filename(os.path.join(folder, f))
    return f"gs://{bucket.name}/{prefix}"


@contextlib.contextmanager
def gcs_emulator(log: str | None = None, port: int = 0):
    """The server, running; yields a google-cloud-storage client of it. ``log``: a file
    the server appends a line to for each download it answers, ``OBJECT<TAB>BYTES``
    (the benchmarks count egress by it); ``port``: 0 for a free one."""
    from schemas import storage, stores

    port = port or _free_port()
    proc = _server(["-m", "evenshard.emulator", "serve-gcs", str(port), *([log] * bool(log))])
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        _wait_for(port, proc, "the GCS emulator")
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        stores.GCS._client = None
        yield storage.gcs_client()
    finally:
        _stop(proc)
        stores.GCS._client = None
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before


@contextlib.contextmanager
def s3_server(port: int = 0):
    """moto's S3 server, running; yields a boto3 client of it (``port``: 0 for a free one)."""
    from schemas import stores

    port = port or _free_port()
    proc = _server(["-c", _MOTO, "-H", "127.0.0.1", "-p", str(port)])
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
        _stop(proc)
        stores.S3._client = None
        for n, v in before.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


# moto's own server (its moto_server command), ended with the process that started it
_MOTO = """
import sys
from evenshard.emulator import end_with_parent
end_with_parent()
from moto.server import main
sys.argv[0] = "moto_server"
main()
"""


def _server(args: list[str]) -> subprocess.Popen:
    """A server process of this interpreter: its own process group (Ctrl-C at a
    terminal reaches the caller, which stops it), and the read end of a pipe only the
    caller holds as its stdin, so that it ends with the caller however the caller
    ends (a ``kill -9`` or a crash runs no ``finally``)."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
    )


def _stop(proc: subprocess.Popen) -> None:
    """Ends a ``_server`` process now, and closes the pipe it watched."""
    proc.kill()
    proc.wait()
    proc.stdin.close()


def end_with_parent() -> None:
    """In a server process (``_server``): exits once its stdin ends, that is when the
    process that started it has ended or closed the pipe."""
    import threading

    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


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
                raise OperationError(f"{what} did not start on port {port}") from None
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
    from gcp_storage_emulator.storage import Storage

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
    Storage._write_config_to_file = lambda self: None  # in memory: read by nobody
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


# The variables that point a client at each store's server, as this process set them.
_VARIABLES = {
    "gs": ("STORAGE_EMULATOR_HOST",),
    "s3": ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"),
}


def main(argv: list[str] | None = None) -> int:
    """``python -m evenshard.emulator gs|s3 [FOLDER]``: a server with a bucket (the folder
    uploaded), until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m evenshard.emulator",
        description="A GCS or S3 server on 127.0.0.1 with a bucket, until Ctrl-C (in memory).",
    )
    parser.add_argument("store", choices=sorted(_VARIABLES), help="which API to serve")
    parser.add_argument("folder", nargs="?", help="a folder to upload to BUCKET/its name/")
    parser.add_argument("--bucket", default="local", help="the bucket to make")
    parser.add_argument("--port", type=int, default=0, help="the port (0: a free one)")
    args = parser.parse_args(argv)
    if args.folder and not os.path.isdir(args.folder):
        parser.error(f"{args.folder} is not a folder")
    import importlib.util

    needed = "gcp_storage_emulator" if args.store == "gs" else "moto"
    if importlib.util.find_spec(needed) is None:
        parser.error(f"the {args.store} server needs the dev extra: pip install -e '.[dev]'")
    serve = gcs_emulator if args.store == "gs" else s3_server
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stops it as Ctrl-C does
    try:
        with serve(port=args.port) as client:
            url = f"{args.store}://{args.bucket}"
            if args.store == "gs":
                client.create_bucket(args.bucket)
            else:
                client.create_bucket(Bucket=args.bucket)
            if args.folder:
                url = _upload_folder(args.store, client, args.bucket, args.folder)
            variables = " ".join(f"{n}={os.environ[n]}" for n in _VARIABLES[args.store])
            print(f"serving {url} on 127.0.0.1 (in memory); in another shell:")
            print(f"  export {variables}")
            print(f"  {convert_line(url, args.folder)}")
            print("Ctrl-C stops it", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("stopped", flush=True)
    except RuntimeError as e:  # the server did not start (the port taken, say)
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


def convert_line(url: str, folder: str | None) -> str:
    """The command converting ``url``, the upload of ``folder``: with the
    ``--input_format`` of its files when they are records of one format
    (``record_input_formats``), else as an image folder (records of several formats:
    convert's own line names them)."""
    from convert_core.record_rules import record_input_formats

    line = f".venv/bin/evenshard convert --input {url} --output_dir {url}-ds"
    if folder:
        names = [
            os.path.relpath(os.path.join(d, f), folder)
            for d, _, files in os.walk(folder)
            for f in files
        ]
        found = record_input_formats(names)
        line += f" --input_format {next(iter(found))}" if len(found) == 1 else ""
    return line


def _upload_folder(store: str, client, bucket: str, folder: str) -> str:
    """Uploads every file under ``folder`` to BUCKET/its name/..., saying how far it got
    every 1,000 files; returns the folder's URL."""
    folder = os.path.abspath(folder)
    prefix = os.path.basename(folder)
    files = [os.path.join(d, f) for d, _, names in os.walk(folder) for f in sorted(names)]
    start = time.monotonic()
    gcs = client.bucket(bucket) if store == "gs" else None
    for done, path in enumerate(files, start=1):
        key = f"{prefix}/{os.path.relpath(path, folder)}"
        if gcs is not None:
            gcs.blob(key).upload_from_filename(path)
        else:
            client.upload_file(path, bucket, key)
        if done % 1000 == 0 or done == len(files):
            seconds = time.monotonic() - start
            print(f"uploaded {done:,} of {len(files):,} files ({seconds:.0f} s)", file=sys.stderr)
    return f"{store}://{bucket}/{prefix}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve-gcs"]:  # the GCS server's own process (gcs_emulator)
        end_with_parent()
        _serve(int(sys.argv[2]), *sys.argv[3:4])
    else:
        sys.exit(main())
