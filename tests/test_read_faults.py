"""Reads that fail end, naming what failed: never a hang, never a stale or wrong answer
(issue 27: a shard removed under a running read, a huge mix weight, a DataLoader worker's
state, states and options a user typed)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import numpy as np
import pytest
from conftest import script_outcomes
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.order.mix import Schedule


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """48 PNGs in 4 train shards."""
    root = tmp_path_factory.mktemp("faults") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=16, formats=("png",))
    out = str(tmp_path_factory.mktemp("faults_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


# Each builds a reader, removes every shard, then iterates: the read must stop naming one.
READERS = {
    # one batch read first, epochs without end: tf.data's prefetch threads are running
    # when the shards go, and runs opened after it find them gone
    "tf.data": (
        "it = iter(reader.make_dataset(D, 'train', 4, seed=0, image_size=(8, 8), epochs=None))\n"
        "next(it)"
    ),
    "dali": (
        "from reader.dali import make_dali_pipeline\n"
        "it = iter(make_dali_pipeline(D, 'train', 4, seed=0, image_size=(8, 8), device='cpu'))"
    ),
    "torch-tf": (
        "from reader.torch import TorchReader\n"
        "it = iter(TorchReader(D, 'train', 4, seed=0, image_size=(8, 8), backend='tf'))"
    ),
    "torch-dali": (
        "from reader.torch import TorchReader\n"
        "it = iter(TorchReader(D, 'train', 4, seed=0, image_size=(8, 8), backend='dali'))"
    ),
}


REMOVED_SCRIPT = r"""
import glob, json, os, sys
import reader


def removed_under(face, code, D):
    ns = {"reader": reader, "D": D}
    exec(code, ns)  # builds the reader as ``it``
    for path in glob.glob(os.path.join(D, "train-*.tfrecord")):
        os.remove(path)
    try:
        for _ in ns["it"]:
            pass
    except Exception as e:
        return "ERROR " + reader.one_line(e)
    return "no error"


if __name__ == "__main__":  # each face in turn, on a copy of its own, in one process
    out = {}
    for face, code, D in json.loads(sys.argv[1]):
        out[face] = removed_under(face, code, D)
        print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def removed_outcomes(data, tmp_path_factory) -> dict:
    """Each face's outcome, the shards removed under its running read (one script)."""
    import shutil

    folder = tmp_path_factory.mktemp("removed")
    faces = []
    for i, face in enumerate(sorted(READERS)):
        copy = str(folder / f"ds{i}")
        shutil.copytree(data, copy)
        faces.append((face, READERS[face], copy))
    script = folder / "removed.py"
    script.write_text(REMOVED_SCRIPT)
    # 120 s a face: a hang fails here ("hung: ")
    return script_outcomes(script, json.dumps(faces), timeout=120 * len(faces))


@pytest.mark.parametrize("face", sorted(READERS))
def test_a_shard_removed_under_a_running_read_stops_it_naming_the_shard(removed_outcomes, face):
    """Issue 27.3: tf.data's reader spun at 100% CPU forever on a shard it could not open
    (``convert --overwrite`` into a folder being read). Every reader stops in seconds."""
    assert removed_outcomes["rc"].startswith("0: "), removed_outcomes["rc"]  # exits cleanly
    line = removed_outcomes.get(face)
    assert line is not None and line.startswith("ERROR "), removed_outcomes
    assert "train-0000" in line and "is missing" in line, line


def test_a_shard_removed_between_its_check_and_its_open_is_still_read_whole(data, tmp_path):
    """The race issue 27.3 left: tf.data opened a run's shard after the check, and a shard
    removed in between sent ignore_errors into a retry loop. The check now opens it, and
    TensorFlow reads that descriptor; a missing shard is the named error."""
    import shutil

    from reader.records.stream import _Held
    from reader.values.split_shards import split_shards
    from schemas import storage, tfrecord

    tf = storage.tensorflow()
    shard = split_shards(json.load(open(f"{data}/dataset_info.json")), data, "train")[0]
    path = str(tmp_path / "shard.tfrecord")
    shutil.copy(shard["path"], path)
    held = _Held()
    fd_path, token = held.open(path.encode(), shard["num_bytes"])
    os.remove(path)  # after the check, before TensorFlow opens it
    got = [r.numpy() for r in tf.data.TFRecordDataset(fd_path.decode())]
    assert got == list(tfrecord.iter_records(shard["path"]))
    held.close(token)
    assert not held.fds
    with pytest.raises(reader.DatasetError, match="shard.tfrecord listed in .* is missing"):
        held.open(path.encode(), shard["num_bytes"])
    with pytest.raises(reader.DatasetError, match="has .* bytes"):
        held.open(shard["path"].encode(), shard["num_bytes"] + 1)


def test_a_corrupt_shard_is_evenshards_line_first_on_every_way_it_is_read(data, tmp_path):
    """A shard whose CRC fails (its size unchanged) stopped make_dataset with TensorFlow's
    words first ("{{function_node __wrapped__IteratorGetNext...}} Error in user-defined
    function...") and reader.one_line left the message in bracketed pieces. Iterated, the
    dataset raises evenshard's line; one_line gives it whole from TensorFlow's error (a
    dataset mapped further); python -m reader prints it."""
    import shutil

    import tensorflow as tf

    from reader.__main__ import main as read_main

    out = str(tmp_path / "ds")
    shutil.copytree(data, out)
    info = json.load(open(f"{out}/dataset_info.json"))
    shard = info["splits"]["train"]["shards"][0]
    path = f"{out}/{shard['file']}"
    damaged = bytearray(open(path, "rb").read())
    damaged[len(damaged) // 2] ^= 0xFF  # inside a record's data: its CRC tells
    open(path, "wb").write(bytes(damaged))
    ds = reader.make_dataset(out, "train", 4, seed=0, image_size=(8, 8))
    with pytest.raises(reader.DatasetError) as e:
        list(ds)
    line = str(e.value)  # (each record is fetched by place and checked: it is named)
    assert re.fullmatch(
        rf"{re.escape(path)}: record \d+ \(byte \d+\): data checksum mismatch: the shard "
        "is corrupt or truncated",
        line,
    ), line
    with pytest.raises(tf.errors.InvalidArgumentError) as e:  # TensorFlow's error, unwrapped
        list(ds.map(lambda b: b))
    assert reader.one_line(e.value) == line
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert read_main([out, "--batch_size=48"]) == 2
    assert err.getvalue() == f"python -m reader: error: {line}\n"


def test_huge_mix_weights_are_relative_and_numpy_numbers_are_weights():
    """Issue 27.4: a weight >= 1e19 overflowed int64 and the schedule's search never ended.
    Weights are relative: (1e19, 1e19) mixes as (1, 1); numpy scalars are accepted."""
    totals = (500, 300)
    huge = Schedule((1e19, 1e19), 5, totals)
    assert (huge.choices(0, 800) == Schedule((1.0, 1.0), 5, totals).choices(0, 800)).all()
    assert list(huge.counts(400)) == [200, 200]
    lopsided = Schedule((1e12, 1.0), 5, (None, None))
    assert lopsided.counts(1000).sum() == 1000
    mixed = reader.mix([("a/", np.float32(0.7)), ("b/", np.int64(3))])
    assert mixed.weights == (pytest.approx(0.7), 3.0)
    for bad in (0, -1, float("nan"), float("inf"), True, "1", np.bool_(True)):
        with pytest.raises(ValueError, match="weights must be"):
            reader.mix([("a/", bad)])
    # a ratio whose small weight would underflow (the schedule's search never ended)
    with pytest.raises(ValueError, match="more than 1e\\+12 apart"):
        reader.mix([("a/", 1e300), ("b/", 1e-300)])


@pytest.mark.parametrize(
    "text, message",
    [
        ("null", "a JSON object was expected"),
        ("[]", "a JSON object was expected"),
        ("{nope", "not JSON text"),
        ('{"seed": 0, "batch_size": 4, "elastic": [0, 0, 0, 0, 0, 0]}', "old worker count"),
        ('{"seed": 0, "batch_size": 4, "elastic": 7}', "6 whole numbers"),
        ('{"seed": 0, "batch_size": 4, "order": "shuffle"}', "name=value pairs"),
        ('{"seed": 0, "batch_size": 4, "elastic": [1, 2, 3, 4, 5, true]}', "6 whole numbers"),
        ('{"seed": 0, "batch_size": 4, "parts": "ab"}', "JSON text"),
        ("{}", "no batch_size and no seed"),
        ('{"seed": 0, "batch_size": 4, "step": 1000000000000000000000000000000}', "2\\*\\*62"),
    ],
)
def test_a_state_that_is_not_one_is_one_line(text, message):
    """Issue 27.13: these were tracebacks (a deep FailedPreconditionError for a huge step)."""
    with pytest.raises((ValueError, TypeError), match=message) as raised:
        reader.ReadState.from_json(text)
    assert "\n" not in str(raised.value)


def test_options_a_user_types_are_one_line_and_an_int_size_is_a_square(data):
    """Issue 27.13: image_size=32 was "'int' object is not iterable"; a start past int64
    a deep TensorFlow error. An int is a square, as torchvision's Resize(32)."""
    assert reader.ReadOptions(image_size=32).image_size == (32, 32)
    assert reader.ReadOptions(image_size=np.int64(5)).image_size == (5, 5)
    assert reader.ReadOptions(image_size=(np.int32(4), 6)).image_size == (4, 6)
    for bad in (32.0, (0, 4), (4,), "32"):
        with pytest.raises(ValueError, match="image_size must be"):
            reader.ReadOptions(image_size=bad)
    with pytest.raises(ValueError, match="start_step must be below 2\\*\\*62"):
        reader.ReadOptions(start_step=10**30)
    batch = next(iter(reader.make_dataset(data, "train", 4, seed=0, image_size=6)))
    assert tuple(batch["image"].shape) == (4, 6, 6, 3)
    state = json.loads(reader.ReadState(0, 4).to_json())
    assert reader.ReadState.from_json(json.dumps(state)) == reader.ReadState(0, 4)


LOADER_RECIPE = r"""
import json, sys
import torch
import reader
from reader.torch import TorchReader


def keys(batches):
    return [k for b in batches for k in b["key"]]


def case(data_dir, backend, context, supervised):
    kw = dict(image_size=(8, 8), seed=0, backend=backend, as_supervised=supervised == "1")
    r = TorchReader(data_dir, "train", 4, **kw)
    loader = torch.utils.data.DataLoader(
        r, batch_size=None, num_workers=1, multiprocessing_context=context
    )
    it = iter(loader)
    got = [next(it) for _ in range(5)]
    step = reader.ReadState.from_json(r.state_dict()["read_state"]).step
    assert step == 5, step  # was 0: the batches were counted in the worker
    saved = r.state_dict()
    del it
    again = iter(loader)  # a new pass starts the read again, and the count
    next(again)
    assert reader.ReadState.from_json(r.state_dict()["read_state"]).step == 1
    del again
    if supervised == "1":
        assert [len(b) for b in got] == [2] * 5  # the DataLoader's lists, as for any tuples
        return "ok"
    rest = TorchReader(data_dir, "train", 4, **kw)
    rest.load_state_dict(saved)
    whole = keys(TorchReader(data_dir, "train", 4, **kw))
    assert keys(got) + keys(rest) == whole, (len(keys(got)), len(keys(rest)), len(whole))
    return "ok"


if __name__ == "__main__":  # the cases in order, in one process (spawned workers import it)
    out = {}
    for args in json.loads(sys.argv[2]):
        try:
            out[" ".join(args)] = case(sys.argv[1], *args)
        except Exception as e:
            out[" ".join(args)] = f"{type(e).__name__}: {e}"
        print(json.dumps(out), flush=True)
"""

# In this order: the forks first, the training process building no pipeline before the
# first of them (the supervised case reads only in its worker); spawn last.
LOADER_CASES = [("dali", "fork", "1"), ("dali", "fork", "0"), ("dali", "spawn", "0")]


@pytest.fixture(scope="module")
def loader_outcomes(data, tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("loader") / "loader.py"
    script.write_text(LOADER_RECIPE)
    # 240 s a case: a hang fails here ("hung: ")
    return script_outcomes(script, data, json.dumps(LOADER_CASES), timeout=240 * 3)


@pytest.mark.parametrize("backend, context, supervised", LOADER_CASES)
def test_state_dict_counts_the_batches_a_dataloader_worker_handed_over(
    loader_outcomes, backend, context, supervised
):
    """Issue 27.5: under DataLoader(num_workers=1) the state never advanced (the batches
    were counted in the worker): a run killed at step 70 resumed at batch 0."""
    got = loader_outcomes.get(" ".join([backend, context, supervised]))
    assert got == "ok", loader_outcomes
    assert loader_outcomes["rc"].startswith("0: "), loader_outcomes["rc"]


def test_batches_the_pin_memory_thread_took_make_state_dict_refuse(data):
    """pin_memory=True (on a GPU machine) takes batches ahead of the loop: refused, never
    a state ahead of what was trained on. The pin thread is its function's frame."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from reader import handover
    from reader.torch import TorchReader

    r = TorchReader(data, "train", 4, image_size=(8, 8), seed=0, backend="tf")
    wire = bytes(ForkingPickler.dumps(handover.sent({"image": 1}, r._read.tally.token, 3)))

    def _pin_memory_loop():  # noqa: N802 - torch's pin thread's name
        return pickle.loads(wire)

    assert pickle.loads(wire) == {"image": 1}
    assert reader.ReadState.from_json(r.state_dict()["read_state"]).step == 3
    _pin_memory_loop()
    with pytest.raises(RuntimeError, match="pin_memory=True"):
        r.state_dict()
