"""The Python route's workers fetch their records themselves (issue 54): the reader's
own process sends each record's place (shard, offset, length) and nothing else; the
workers read, check, parse and decode it. The batches are the in-process read's,
byte for byte."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.records import record_offsets
from reader.routes import preprocess

B = 8
OPTS = dict(image_size=(32, 32), seed=5, epochs=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """60 images (PNG and JPEG) in 3 train shards."""
    root = tmp_path_factory.mktemp("placed") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=20, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("placed_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=3")
    return out


def _batches(data, processes):
    return [
        {k: np.array(v) for k, v in b.items()}
        for b in reader.NumpyReader(data, "train", B, num_processes=processes, **OPTS)
    ]


def test_the_readers_process_fetches_no_record_and_sends_only_places(data, monkeypatch):
    here = _batches(data, 0)
    fetched, sent = [], []
    real_fetch, real_task = record_offsets.fetch, preprocess._task

    def counted_fetch(place, fds):
        fetched.append(place)
        return real_fetch(place, fds)

    def measured_task(batch):
        task = real_task(batch)
        sent.append(len(pickle.dumps(task)))
        return task

    monkeypatch.setattr(record_offsets, "fetch", counted_fetch)
    monkeypatch.setattr(preprocess, "_task", measured_task)
    there = _batches(data, 2)
    assert fetched == []  # every record fetched in a worker process
    assert sent and max(sent) < 120 * B  # places: about 100 bytes a row, no image
    assert len(there) == len(here) == 60 * 2 // B
    for a, b in zip(here, there):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert {k for b in there for k in b["key"] if k} == {
        k for b in here for k in b["key"] if k
    }  # (and 60 of them: the read is whole)
    assert len({k for b in there for k in b["key"] if k}) == 60


def test_a_damaged_record_fetched_in_a_worker_names_its_shard(data, tmp_path):
    """The record's check (its CRCs) runs where it is fetched: a flipped byte in an
    image stops the read with the shard, record and offset named."""
    copy = str(tmp_path / "ds")
    shutil.copytree(data, copy)
    path = os.path.join(copy, "train-00001-of-00003.tfrecord")
    with open(path, "r+b") as f:
        f.seek(400)
        byte = f.read(1)
        f.seek(400)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(reader.DatasetError, match=rf"{os.path.basename(path)}.*corrupt"):
        for _ in reader.NumpyReader(copy, "train", B, num_processes=2, **OPTS):
            pass


def test_a_read_by_place_of_many_shards_holds_few_descriptors(tmp_path):
    """A chunk of one permutation touches most shards: 300 shards read under a limit of
    200 open files (a read held every shard a chunk touched open: "Too many open
    files"), on tf.data and on the Python route's workers."""
    import subprocess
    import sys

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=150, formats=("png",))
    out = str(tmp_path / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=300")
    script = f"""
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import reader
ds = reader.make_dataset({out!r}, "train", 16, seed=0, decode=False)
keys = [k for b in ds for k in b["key"].numpy()]
assert len(set(keys)) == 300, len(set(keys))
r = reader.NumpyReader({out!r}, "train", 16, seed=0, image_size=(8, 8), num_processes=2)
assert len({{k for b in r for k in b["key"]}}) == 300
print("ok")
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert run.stdout.strip().endswith("ok"), run.stderr[-2000:]
