"""Shared fixtures: generated image folders and helpers to convert and read back."""

from __future__ import annotations

import json
import os
import signal

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A run started in the background (nohup, `make test &`) inherits SIGINT ignored, and
# so would each process a test starts (an ignored signal stays ignored through exec):
# the Ctrl-C tests need it as a terminal leaves it. They send it to their own children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


import schemas  # noqa: E402
from beam_jobs import convert  # noqa: E402
from evenshard import synthetic  # noqa: E402
from schemas import layout  # noqa: E402


@pytest.fixture(scope="session")
def folder_500(tmp_path_factory):
    """500 images over 5 labels (jpeg, png, gif, webp) plus broken files; and their rejects."""
    root = str(tmp_path_factory.mktemp("folder_500") / "images")
    broken = synthetic.make_image_folder(
        root, num_labels=5, per_label=100, formats=("jpeg", "png", "gif", "webp"), broken=True
    )
    return root, broken


def run_convert(input_path: str, output_dir: str, *flags: str, validated: bool = True) -> dict:
    """Runs convert in-process on the DirectRunner; returns dataset_info, after checking
    that the dataset passes ``validate --full`` (``validated=False``: the test checks)."""
    argv = [f"--input={input_path}", f"--output_dir={output_dir}", *flags]
    if not any(f.startswith(("--runner", "--direct")) for f in flags):
        # One in-memory worker: the quickest start for the tests' tiny inputs. The
        # default (all cores) is pinned to the same bytes in test_runners.py.
        argv.append("--direct_running_mode=in_memory")
    if not any(f.startswith("--max_reject_fraction") for f in flags):
        argv.append("--max_reject_fraction=0.05")
    info = convert.run(argv)
    # every dataset the tests build passes its own full validation
    from audit.validate import validate

    assert not validated or validate(output_dir, full=True) == [], output_dir
    return info


def assert_multi_process_gives_the_same_bytes(input_path: str, tmp_path, *flags: str) -> None:
    """Converts ``input_path`` with one in-memory worker and with two worker processes:
    every shard's sha256 alike, split by split."""
    runs = [
        run_convert(input_path, str(tmp_path / "in_memory"), *flags),
        run_convert(
            input_path,
            str(tmp_path / "multi_process"),
            *flags,
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ),
    ]
    shas = [
        [s["sha256"] for split in sorted(i["splits"]) for s in i["splits"][split]["shards"]]
        for i in runs
    ]
    assert shas[0] and shas[0] == shas[1]


def read_split(output_dir: str, split: str) -> list[list[dict]]:
    """Per shard, the records of a split in file order, as {feature: value} dicts."""
    import tensorflow as tf

    info = load_info(output_dir)
    compression = "GZIP" if info["compression"] == "gzip" else None
    shards = []
    for shard in info["splits"][split]["shards"]:
        records = []
        path = os.path.join(output_dir, shard["file"])
        for raw in tf.data.TFRecordDataset(path, compression_type=compression):
            ex = tf.train.Example.FromString(raw.numpy())
            records.append(
                {
                    name: (
                        list(f.int64_list.value)[0] if f.int64_list.value else f.bytes_list.value[0]
                    )
                    for name, f in ex.features.feature.items()
                }
            )
        shards.append(records)
    return shards


def keys_of(records) -> list[str]:
    return [r["image/key"].decode() for r in records]


def load_info(output_dir: str) -> dict:
    return schemas.load_info(output_dir)


def files_of(folder) -> dict[str, bytes]:
    """{path relative to ``folder``: bytes} of every file below it."""
    found = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def read_rejects(output_dir: str) -> list[dict]:
    with open(layout.join(output_dir, layout.REJECTS_FILE)) as f:
        return [json.loads(line) for line in f]


def script_outcomes(script, *args: str, timeout: float) -> dict:
    """The JSON object a test's script prints last, with its exit status and the tail
    of its stderr under "rc" ("0: ..." when it ran through; "hung: ..." past
    ``timeout`` seconds)."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        return {"rc": f"hung: {e}: {e.stdout!r}"}
    lines = done.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {}
    out["rc"] = f"{done.returncode}: {done.stderr[-3000:]}"
    return out


def write_manifest(path: str, rows: list[dict], columns: list[str]) -> str:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)
    return path


def write_pngs(root, n: int) -> None:
    """``n`` small PNGs in ``root/l0``, ``root/l1`` (alternating), named ``i.png``."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(n):
        path = os.path.join(root, f"l{i % 2}", f"{i}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(synthetic.image_bytes("png", 8, 8, rng))


class Bucket:
    """A fresh bucket of a loopback server (gs:// or s3://): ``url`` is SCHEME://NAME."""

    def __init__(self, scheme: str, client, name: str):
        self.scheme, self.client, self.name = scheme, client, name
        self.url = f"{scheme}://{name}"
        if scheme == "gs":
            self._gcs = client.create_bucket(name)
        else:
            client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "gs":
            self._gcs.blob(key).upload_from_string(data)
        else:
            self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        if self.scheme == "gs":
            return self._gcs.blob(key).download_as_bytes()
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        if self.scheme == "gs":
            self._gcs.blob(key).delete()
        else:
            self.client.delete_object(Bucket=self.name, Key=key)

    def exists(self, key: str) -> bool:
        from schemas import storage

        return storage.exists(f"{self.url}/{key}")

    def upload(self, local: str, prefix: str) -> str:
        """Copies every file under ``local`` to SCHEME://NAME/prefix/...; returns that URL."""
        for folder, _, files in os.walk(local):
            for f in files:
                rel = os.path.relpath(os.path.join(folder, f), local)
                with open(os.path.join(folder, f), "rb") as data:
                    self.put(f"{prefix}/{rel}", data.read())
        return f"{self.url}/{prefix}"


@pytest.fixture(scope="session")
def gcs_server():
    """A GCS JSON API server on 127.0.0.1 for the session (``evenshard.emulator``):
    ``STORAGE_EMULATOR_HOST`` points at it; it stops with the session."""
    from evenshard.emulator import gcs_emulator

    with gcs_emulator() as client:
        yield client


@pytest.fixture(scope="session")
def s3_server():
    """An S3 API server (moto) on 127.0.0.1 for the session (``evenshard.emulator``):
    ``AWS_ENDPOINT_URL`` points at it; it stops with the session."""
    from evenshard.emulator import s3_server

    with s3_server() as client:
        yield client


@pytest.fixture(scope="session")
def dask_runner_flags():
    """``--runner=dask`` flags for a loopback Dask LocalCluster of 2 worker processes,
    one a test process, started at the first test that asks and stopped with the
    session: each Dask test's job runs on workers that ran jobs before, as on a user's
    long-lived cluster. (``--dask_workers``, the alias that starts and stops a cluster
    of its own, is test_runners'.)"""
    from beam_jobs.runners import loopback_cluster

    with loopback_cluster(2) as cluster:  # the one --dask_workers=2 starts
        yield ["--runner=dask", f"--dask_client_address={cluster.scheduler_address}"]


@pytest.fixture(params=["gs", "s3"])
def bucket(request):
    """A fresh bucket on a loopback server, of each store, named after the test."""
    import hashlib

    client = request.getfixturevalue("gcs_server" if request.param == "gs" else "s3_server")
    name = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40]
    digest = hashlib.sha256(request.node.name.encode()).hexdigest()[:8]
    return Bucket(request.param, client, f"t-{name.strip('-')}-{digest}")
