"""Issue 45.3: a record that cannot be read mid-epoch (its bytes damaged after convert, a
path record's file removed): ``on_error="skip"`` gives its row as a padding row on every
face (tf.data through the Python route), writes it once an occurrence to the ledger
(key, shard, offset, reason, epoch, step), the same on every read and every face, a
resumed read too, and stops at ``max_errors`` in one line; "raise" (the default) stops
at it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from controls_data import read_face
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.values.split_shards import load_index, split_shards
from schemas import features, tfrecord
from schemas.example import parse_example

OPTS = dict(image_size=(8, 8), seed=4, shuffle_buffer=8, cycle_length=2, epochs=2)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """24 images in 2 shards, and a copy whose record 3 of shard 0 has a flipped byte."""
    root = tmp_path_factory.mktemp("errors") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=12, formats=("png",))
    good = str(tmp_path_factory.mktemp("errors_out") / "ds")
    write_dataset(str(root), good, "--splits=train=1.0", "--num_shards=2")
    bad = str(tmp_path_factory.mktemp("errors_bad") / "ds")
    shutil.copytree(good, bad)
    path, offset = flip_a_byte(bad, 3)
    return good, bad, path, offset


def flip_a_byte(data: str, record: int) -> tuple[str, int]:
    """Flips the middle byte of ``record`` of the train split's first shard: its
    (path, offset)."""
    shard = {**split_shards(reader.load_info(data), data, "train")[0]}
    offset, size = (int(v) for v in load_index(shard)[record])
    with open(shard["path"], "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return shard["path"], offset


def spoil_an_image(data: str, record: int) -> tuple[str, int]:
    """Overwrites the image bytes of ``record`` of the train split's first shard with
    zeros, its CRC made good: a record that parses and an image that does not decode.
    Its (path, offset)."""
    shard = {**split_shards(reader.load_info(data), data, "train")[0]}
    offset, size = (int(v) for v in load_index(shard)[record])
    with open(shard["path"], "r+b") as f:
        f.seek(offset)
        framed = f.read(size)
        body = framed[12:-4]
        image = parse_example(body)[features.ENCODED]
        body = body.replace(image, bytes(len(image)))
        f.seek(offset)
        f.write(tfrecord.frame(body))
    return shard["path"], offset


def same(example, rng):
    return example


def read(data, **kw):
    r = reader.NumpyReader(data, "train", 4, transform=same, num_processes=0, **OPTS, **kw)
    return [list(b["key"]) for b in r]


def test_a_damaged_record_is_a_padding_row_written_once_to_the_ledger(damaged, tmp_path):
    good, bad, path, offset = damaged
    with pytest.raises(reader.DatasetError, match="corrupt") as e:
        read(bad)
    assert "\n" not in str(e.value) and f"{path}: record 3 " in str(e.value)
    with pytest.raises(Exception) as e:  # tf.data's graph: its error names the shard
        list(reader.make_dataset(bad, "train", 4, **OPTS))
    assert path in str(e.value)
    ledger = str(tmp_path / "ledger.jsonl")
    got = read(bad, on_error="skip", error_ledger=ledger)
    want = read(good)
    lost = [k for b, w in zip(got, want) for k, v in zip(b, w) if k != v]
    assert lost == ["", ""] and sum(k == "" for b in got for k in b) == 2  # once an epoch
    lines = [json.loads(line) for line in open(ledger)]
    assert [(x["shard"], x["offset"], x["epoch"]) for x in lines] == [
        (path, offset, 0),
        (path, offset, 1),
    ]
    gone = {w[i] for b, w in zip(got, want) for i, k in enumerate(b) if k != w[i]}
    assert [x["key"] for x in lines] == sorted(gone) * 2  # named, though damaged
    assert all("checksum mismatch" in x["reason"] for x in lines)
    assert [x["step"] for x in lines] == [
        s for s, b in enumerate(got) for k, w in zip(b, want[s]) if k != w
    ]
    assert read(bad, on_error="skip", error_ledger=ledger) == got  # deterministic
    # its batches full where every one is: the dataset's fixed batch dimension holds
    full = reader.make_dataset(
        bad, "train", 4, on_error="skip", error_ledger=ledger + "2", drop_remainder=True, **OPTS
    )
    assert full.element_spec["image"].shape[0] == 4
    masks = [b["mask"].numpy() for b in full]
    assert all(len(m) == 4 for m in masks) and sum((~m).sum() for m in masks) == 2
    assert len(open(ledger).readlines()) == 4
    with pytest.raises(reader.DatasetError, match="max_errors=1") as e:
        read(bad, on_error="skip", error_ledger=ledger, max_errors=1)
    assert ledger in str(e.value) and "\n" not in str(e.value)


def test_on_error_is_checked_and_refused_where_it_cannot_hold(damaged, tmp_path):
    good, *_ = damaged
    with pytest.raises(ValueError, match="give error_ledger"):
        read(good, on_error="skip")
    with pytest.raises(ValueError, match='"raise" or "skip"'):
        read(good, on_error="ignore")
    with pytest.raises(ValueError, match="give batch_size"):  # the Python route batches
        reader.make_dataset(good, "train", None, on_error="skip", error_ledger=str(tmp_path))
    kw = dict(image_size=8, on_error="skip", error_ledger=str(tmp_path / "l"))
    assert reader.TorchReader(good, "train", 4, **kw).backend == "python"  # by default
    with pytest.raises(ValueError, match='backend="python" or "dali"'):
        reader.TorchReader(
            good,
            "train",
            4,
            image_size=8,
            backend="tf",
            on_error="skip",
            error_ledger=str(tmp_path / "l"),
        )


@pytest.fixture(scope="module")
def removed(tmp_path_factory):
    """24 images as path records in 2 shards, one image's file then removed (not the first
    record of a shard: that one stands in padding rows); the whole folder read by
    ``path_root`` is the dataset undamaged."""
    root = tmp_path_factory.mktemp("removed") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=12, formats=("png",))
    whole = tmp_path_factory.mktemp("removed_whole") / "images"
    shutil.copytree(root, whole)
    out = str(tmp_path_factory.mktemp("removed_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2", "--record_kind=path")
    shard = split_shards(reader.load_info(out), out, "train")[1]
    offset = int(load_index(shard)[2][0])  # record 2
    record = list(tfrecord.iter_records(shard["path"]))[2]
    os.remove(root / parse_example(record)[features.PATH].decode())
    return out, str(whole), shard["path"], offset


FACES = ("tf.data", "numpy", "torch-python", "torch-dali", "dali")


@pytest.fixture(scope="module")
def spoiled(tmp_path_factory, damaged):
    """The damaged fixture's dataset with record 3 of shard 0 whole but its image zeros."""
    good = damaged[0]
    bad = str(tmp_path_factory.mktemp("errors_spoiled") / "ds")
    shutil.copytree(good, bad)
    path, offset = spoil_an_image(bad, 3)
    return good, bad, path, offset


def skipping(face, data, ledger, state=None, **kw):
    """Every batch ``face`` yields reading ``data`` with on_error="skip" into ``ledger``,
    and the ledger's lines."""
    kw = dict(OPTS, on_error="skip", error_ledger=ledger, **kw)
    if face == "tf.data":
        kw["num_processes"] = 0
    got = read_face(face, data, "train", 4, state=state, **kw)
    return got, [json.loads(line) for line in open(ledger)]


@pytest.mark.parametrize("damage", ["flipped byte", "file removed", "image spoiled"])
def test_every_face_skips_a_damaged_record_alike_and_so_does_a_resumed_read(
    damaged, removed, spoiled, damage, tmp_path
):
    """tf.data, NumpyReader, TorchReader (python, dali) and make_dali_pipeline (CPU): the
    same keys, masks and labels, the pixels of every good row those of the undamaged
    read (the Python faces; DALI's own decoder: its padding rows zeros), the damaged
    record's row a padding row in each epoch, and the same ledger: the record once an
    epoch. Resumed at step 3, each face yields the uninterrupted read's batches from
    there and writes the ledger's lines of those steps. An image that does not decode
    in a record that parses is skipped the same way (DALI decodes where Python cannot
    look first: ``faces`` leaves them out there)."""
    faces = FACES
    if damage == "flipped byte":
        good, bad, path, offset = damaged
        undamaged = {}
    elif damage == "image spoiled":
        good, bad, path, offset = spoiled
        undamaged = {}
        faces = tuple(f for f in FACES if not f.endswith("dali"))
    else:
        bad, whole, path, offset = removed
        good, undamaged = bad, dict(path_root=whole)
    want = read_face("numpy", good, "train", 4, **OPTS, **undamaged)
    reads = {f: skipping(f, bad, str(tmp_path / f"{f}.jsonl")) for f in faces}
    got, ledger = reads["numpy"]
    lost = [
        (s, i) for s, b in enumerate(want) for i, k in enumerate(b["key"]) if got[s]["key"][i] != k
    ]
    assert len(lost) == 2 and all(got[s]["key"][i] == "" for s, i in lost)  # once an epoch
    assert [(x["shard"], x["offset"], x["epoch"], x["step"]) for x in ledger] == [
        (path, offset, 0, lost[0][0]),
        (path, offset, 1, lost[1][0]),
    ]
    assert [x["key"] for x in ledger] == [want[s]["key"][i] for s, i in lost]
    for face, (batches, lines) in reads.items():
        assert lines == ledger, face
        assert [b["key"] for b in batches] == [b["key"] for b in got], face
        for b, g, w in zip(batches, got, want):
            assert (b["mask"] == g["mask"]).all() and (b["label"] == g["label"]).all(), face
            if face.endswith("dali"):
                assert not b["image"][~b["mask"]].any()
            else:
                assert (b["image"][b["mask"]] == w["image"][b["mask"]]).all(), face
    if damage == "image spoiled":
        assert all(x["reason"].startswith("the image does not decode") for x in ledger)
        ledger2 = str(tmp_path / "processes.jsonl")  # skipped in worker processes alike
        kw = dict(OPTS, on_error="skip", error_ledger=ledger2)
        two = reader.NumpyReader(bad, "train", 4, transform=same, num_processes=2, **kw)
        assert [list(b["key"]) for b in two] == [b["key"] for b in got]
        assert [json.loads(line) for line in open(ledger2)] == ledger
        for face in ("dali", "torch-dali"):  # DALI's decoder meets it: one line naming it
            with pytest.raises(reader.DatasetError, match="DALI could not decode") as e:
                skipping(face, bad, str(tmp_path / f"{face}.jsonl"))
            assert repr(ledger[0]["key"]) in str(e.value) and "\n" not in str(e.value)
    for face in faces:
        state = reader.ReadState(OPTS["seed"], 4).advance(3)
        again, lines = skipping(face, bad, str(tmp_path / f"{face}-resumed.jsonl"), state=state)
        assert [b["key"] for b in again] == [b["key"] for b in got[3:]], face
        assert all((a["mask"] == b["mask"]).all() for a, b in zip(again, got[3:])), face
        assert lines == [x for x in ledger if x["step"] >= 3] and lines, face


def test_both_kinds_of_damage_give_one_ledger_for_any_processes(damaged, tmp_path):
    """A record that does not parse and an image that does not decode in one read: the
    same batches and the same ledger, in step order, with 0 and 2 worker processes
    (a parse failure was written as its batch was made, ahead of the decode), and
    max_errors stops both after the same batches."""
    good = damaged[0]
    bad = str(tmp_path / "ds")
    shutil.copytree(good, bad)
    spoil_an_image(bad, 1)
    flip_a_byte(bad, 4)
    got = {}
    for processes in (0, 2):
        ledger = str(tmp_path / f"{processes}.jsonl")
        kw = dict(OPTS, on_error="skip", error_ledger=ledger, num_processes=processes)
        batches = reader.NumpyReader(bad, "train", 4, transform=same, **kw)
        keys = [list(b["key"]) for b in batches]
        lines = [json.loads(line) for line in open(ledger)]
        stopped = []
        kw.update(max_errors=2, error_ledger=str(tmp_path / f"{processes}-max.jsonl"))
        with pytest.raises(reader.DatasetError, match="max_errors=2"):
            for b in reader.NumpyReader(bad, "train", 4, transform=same, **kw):
                stopped.append(list(b["key"]))
        got[processes] = keys, lines, stopped
    assert got[0] == got[2]
    keys, lines, stopped = got[0]
    assert len(lines) == 4 and [x["step"] for x in lines] == sorted(x["step"] for x in lines)
    assert {x["reason"].startswith("the image does not decode") for x in lines} == {True, False}
    assert stopped == keys[: len(stopped)] and len(stopped) < len(keys)


def test_max_errors_stops_every_face_alike(damaged, tmp_path):
    """max_errors=1: the second occurrence stops each face in one line naming the ledger,
    which holds the same two lines on every face."""
    _, bad, _, _ = damaged
    lines = {}
    for face in FACES:
        ledger = str(tmp_path / f"{face}.jsonl")
        with pytest.raises(Exception) as e:  # tf.data wraps it: one_line unwraps
            skipping(face, bad, ledger, max_errors=1)
        said = reader.one_line(e.value)
        assert "max_errors=1" in said and ledger in said, (face, said)
        if face != "tf.data":
            assert isinstance(e.value, reader.DatasetError) and "\n" not in str(e.value)
        lines[face] = [json.loads(line) for line in open(ledger)]
    assert len(lines["numpy"]) == 2
    assert all(v == lines["numpy"] for v in lines.values()), lines


def test_tf_data_with_on_error_skip_gives_keras_weights(damaged, tmp_path):
    """as_supervised with on_error="skip", decoded in 2 worker processes: (image, label,
    weight), the damaged row's weight 0, every other 1, the images and labels those of
    the dicts; prefetch_to_device is refused in one line."""
    _, bad, _, _ = damaged
    kw = dict(OPTS, on_error="skip", error_ledger=str(tmp_path / "l"), num_processes=2)
    ds = reader.make_dataset(bad, "train", 4, as_supervised=True, **kw)
    dicts = read_face("tf.data", bad, "train", 4, **kw)
    got = [tuple(v.numpy() for v in t) for t in ds]
    assert all(
        (i == d["image"]).all() and (y == d["label"]).all() for (i, y, _), d in zip(got, dicts)
    )
    weights = np.concatenate([w for _, _, w in got])
    assert weights.dtype == np.float32 and sorted(set(weights)) == [0.0, 1.0]
    assert list(weights) == list(np.concatenate([d["mask"] for d in dicts]))
    assert (weights == 0).sum() == 2 and len(got) == len(dicts)
    with pytest.raises(ValueError, match="prefetch_to_device") as e:
        reader.make_dataset(bad, "train", 4, prefetch_to_device="/gpu:0", **kw)
    assert "\n" not in str(e.value)


def test_a_damaged_first_record_does_not_stand_in_for_the_padding(tmp_path_factory, tmp_path):
    """An all-padding batch takes its filler from the worker's shards: with
    ``on_error="skip"``, a damaged first record is passed over there too (it used to
    stop the read that was told to skip it)."""
    root = tmp_path_factory.mktemp("first") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png",))
    data = str(tmp_path / "ds")
    write_dataset(str(root), data, "--splits=train=1.0", "--num_shards=1")
    flip_a_byte(data, 0)
    kw = dict(transform=same, num_processes=0, image_size=(8, 8), seed=4, epochs=1)
    kw.update(on_error="skip", error_ledger=str(tmp_path / "ledger.jsonl"))
    first = next(iter(reader.NumpyReader(data, "train", 4, **kw)))
    state = reader.ReadState(4, 4).exclude([k for k in first["key"] if k])
    got = list(reader.NumpyReader(data, "train", 4, state=state, **kw))
    assert not got[0]["mask"].any()  # every row excluded: the filler's batch
    assert sum(int(b["mask"].sum()) for b in got) == 12 - 1 - len([k for k in first["key"] if k])


# A script with no ``if __name__ == "__main__":``: it notes each run of its top level,
# then reads with on_error="skip" in 2 worker processes ({transform}: none, or a
# module's).
UNGUARDED = """
import sys
import reader
from preprocess_transforms import plain

data, ledger, runs = {data!r}, {ledger!r}, {runs!r}
with open(runs, "a") as f:
    f.write("ran\\n")
ds = reader.make_dataset(data, "train", 4, on_error="skip", error_ledger=ledger,
                         image_size=(8, 8), seed=4, epochs=1, num_processes=2,
                         transform={transform})
print(sum(int(b["mask"].numpy().sum()) for b in ds))
"""


def _run_unguarded(damaged, tmp_path, fed: str, transform: str):
    """The script run from a file or fed on stdin: (the run, its top level's runs)."""
    runs, ledger = tmp_path / "runs", tmp_path / "ledger.jsonl"
    script = UNGUARDED.format(
        data=damaged[1], ledger=str(ledger), runs=str(runs), transform=transform
    )
    (tmp_path / "train.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.path.dirname(__file__)]))
    command = [sys.executable, "train.py"] if fed == "file" else [sys.executable, "-"]
    done = subprocess.run(
        command,
        input=script if fed == "stdin" else None,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    return done, runs.read_text()


@pytest.mark.parametrize("fed", ["file", "stdin"])
def test_on_error_skip_without_a_transform_needs_no_guard_nor_a_script_file(damaged, tmp_path, fed):
    """make_dataset(on_error="skip") without a transform decodes in processes that do not
    import the script: an unguarded script runs its top once and reads past the damaged
    record, and so does one read on stdin (whose processes found no file to import)."""
    _, _, path, offset = damaged
    done, runs = _run_unguarded(damaged, tmp_path, fed, "None")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["23"]  # 24 records, the damaged one a padding row
    assert runs == "ran\n"  # the top level ran once: in the script alone
    lines = [json.loads(line) for line in open(tmp_path / "ledger.jsonl")]
    assert [(x["shard"], x["offset"]) for x in lines] == [(path, offset)]


@pytest.mark.parametrize("fed", ["file", "stdin"])
def test_a_transform_in_processes_refuses_a_script_they_cannot_import_in_one_line(
    damaged, tmp_path, fed
):
    """A transform's processes import the script: an unguarded one, or one read on stdin,
    is refused in one line before any process starts (each process ran the script again,
    or failed to find it, each with its traceback, before a line that guessed why)."""
    done, runs = _run_unguarded(damaged, tmp_path, fed, "plain")
    assert done.returncode == 1 and runs == "ran\n"
    said = done.stderr.strip().splitlines()
    assert done.stderr.count("Traceback") == 1, done.stderr[-3000:]
    assert 'if __name__ == "__main__":' in said[-1] and "num_processes=0" in said[-1]
    assert ("stdin" in said[-1]) == (fed == "stdin"), said[-1]


def test_one_line_gives_the_damaged_record_s_line_from_inside_keras_fit(damaged):
    """Keras' fit runs the read inside a tf.function: its error starts "Graph execution
    error:" and names the node; ``one_line`` gives the reader's own line all the same,
    on the graph route and from worker processes (whose error came unreadable when a
    library the script imported pickled it with its context)."""
    import keras

    _, bad, path, _ = damaged
    layers = [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
    model = keras.Sequential(layers)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for kw in ({}, {"num_processes": 2}):
        # the damaged record not in the first batch (seed 0), which the worker
        # processes' dataset reads as it is made (for its signature)
        options = {**OPTS, "seed": 0, **kw}
        ds = reader.make_dataset(bad, "train", 4, as_supervised=True, **options)
        with pytest.raises(Exception) as e:
            model.fit(ds, epochs=1, verbose=0)
        assert str(e.value).startswith("Graph execution error")
        said = reader.one_line(e.value)
        assert said.startswith(f"{path}: record 3 ") and "checksum" in said, (kw, said)
