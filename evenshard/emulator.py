"""A GCS API server on loopback for the tests and benchmarks (``gcp-storage-emulator``).

``with gcs_emulator() as client:`` starts the server on a free port of 127.0.0.1,
in memory, points ``STORAGE_EMULATOR_HOST`` at it (google-cloud-storage and Beam's
GCS filesystem honour it; TensorFlow's own GCS client does not), and stops it
and restores the variable on leaving.
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
def gcs_emulator():
    """The server, running; yields a google-cloud-storage client of it."""
    from schemas import storage

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = os.path.join(os.path.dirname(sys.executable), "gcp-storage-emulator")
    proc = subprocess.Popen(
        [server, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the GCS emulator did not start") from None
                time.sleep(0.1)
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        storage._client = None
        yield storage.gcs_client()
    finally:
        proc.kill()
        proc.wait()
        storage._client = None
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before
