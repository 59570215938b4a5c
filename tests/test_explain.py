"""Issue 45.1: ``reader.explain`` gives the keys (views, epochs, crops) of each batch of
any steps of any rank, without reading the records' images, equal to what every face
yields: from the start, after a resume, after 3 -> 2 workers, with a mix, with views
spread; and ``evenshard explain`` prints it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from controls_data import controls_dataset, keys, same, saved_after, told

import reader
from reader.explain import explain

OPTS = dict(image_size=(8, 8), seed=4, shuffle_buffer=16, cycle_length=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """72 images: train (4 shards: 3 workers read unequal counts) and val."""
    return controls_dataset(tmp_path_factory)


def numpy_reader(data, batch_size, state=None, **kw):
    r = reader.NumpyReader(data, "train", batch_size, transform=same, num_processes=0, **kw)
    if state is not None:
        r.load_state_dict(state)
    return r


def test_explain_equals_every_batch_of_each_face(data):
    """Every step of two epochs of rank 1 of 3, on tf.data, NumpyReader and TorchReader
    (tf backend): the keys yielded are those explained; NumpyReader's epochs, views and
    mask too, with views together and crops drawn."""
    kw = dict(OPTS, epochs=2, num_workers=3, worker_index=1)
    tf_batches = [
        {k: v.numpy() for k, v in b.items()} for b in reader.make_dataset(data, "train", 6, **kw)
    ]
    said = explain(data, "train", 6, range(len(tf_batches)), **kw)
    assert told(said) == keys(tf_batches) and len(said) == 5
    torch = reader.TorchReader(data, "train", 6, backend="tf", **kw)
    assert keys(list(torch)) == told(said)
    crops = dict(kw, random_crop=True, random_flip=True)
    py = list(numpy_reader(data, 6, views=2, mirror_views=True, **crops))
    said = explain(data, "train", 6, range(len(py)), views=2, mirror_views=True, **crops)
    assert told(said) == keys(py)
    for b, s in zip(py, said):
        assert (b["epoch"] == s["epoch"]).all() and (b["view"] == s["view"]).all()
        assert (b["mask"] == s["mask"]).all() and s["box"].shape == (len(s["key"]), 4)
        assert (s["flip"][0::2] != s["flip"][1::2]).all()  # mirrored pairs
    with pytest.raises(ValueError, match="past the end of the read"):
        explain(data, "train", 6, [len(py)], views=2, **crops)


def test_explain_after_a_resume_and_after_3_to_2_workers(data):
    """A state saved at step 3 by 3 workers: explain from it equals the resumed read, with
    the same workers and with 2 (the elastic lead first); steps continue the state's."""
    kw = dict(OPTS, epochs=2)
    saved = []
    for w in range(3):
        r = numpy_reader(data, 4, num_workers=3, worker_index=w, **kw)
        it = iter(r)
        for _ in range(3):
            next(it)
        it.close()
        saved.append(r.state_dict())
    assert saved[0] == saved[1] == saved[2]
    again = list(numpy_reader(data, 4, state=saved[1], num_workers=3, worker_index=1, **kw))
    said = explain(
        data,
        "train",
        4,
        range(3, 3 + len(again)),
        state=saved[1],
        num_workers=3,
        worker_index=1,
        **kw,
    )
    assert told(said) == keys(again)
    for j in range(2):
        two = list(numpy_reader(data, 4, state=saved[0], num_workers=2, worker_index=j, **kw))
        state = saved[0]["read_state"]  # a ReadState's JSON does as well
        said = explain(
            data, "train", 4, (3, 3 + len(two)), state=state, num_workers=2, worker_index=j, **kw
        )
        assert told(said) == keys(two)
        assert [list(s["epoch"]) for s in said] == [list(b["epoch"]) for b in two]
    with pytest.raises(ValueError, match="before the state's first step"):
        explain(data, "train", 4, [2], state=saved[0], **kw)


def test_explain_a_mix_and_views_spread(data):
    """A mix of train and val at 3:1 (tf.data), and views spread 2 batches apart
    (NumpyReader, and make_dataset from the start) from the start and from a state
    saved between an image's views."""
    mix = reader.mix([((data, "train"), 3), ((data, "val"), 1)])
    got = [{k: v.numpy() for k, v in b.items()} for b in reader.make_dataset(mix, None, 4, **OPTS)]
    said = explain(mix, None, 4, range(len(got)), **OPTS)
    assert told(said) == keys(got) and len(got) == 18
    kw = dict(OPTS, epochs=2, views=3, view_spread=2)
    whole = list(numpy_reader(data, 4, **kw))
    said = explain(data, "train", 4, range(len(whole)), **kw)
    assert told(said) == keys(whole)
    assert [list(s["view"]) for s in said] == [list(b["view"]) for b in whole]
    spread = reader.make_dataset(data, "train", 4, transform=same, num_processes=0, **kw)
    spread = list(spread.as_numpy_iterator())
    assert keys(spread) == told(said)
    assert [list(b["view"]) for b in spread] == [list(s["view"]) for s in said]
    r = numpy_reader(data, 4, **kw)
    state = saved_after(r, 7)
    assert state["view_skip"] > 0
    said = explain(data, "train", 4, range(7, len(whole)), state=state, **kw)
    assert told(said) == keys(whole[7:])


@pytest.mark.parametrize("spread", [0, True, -1, "2", 2.0, 99])
def test_explain_refuses_the_views_settings_the_readers_refuse(data, spread):
    """A view_spread no reader takes (not a whole number >= 1, or more batches than the
    read has) is the readers' own error from explain too, never batches or a TypeError."""
    kw = dict(OPTS, views=2, view_spread=spread)
    with pytest.raises((ValueError, TypeError)) as refused:
        numpy_reader(data, 4, **kw)
    with pytest.raises(type(refused.value), match=re.escape(str(refused.value))):
        explain(data, "train", 4, range(2), **kw)


def test_explain_never_reads_the_images(data, tmp_path):
    """Every image's bytes in the shards overwritten (the keys, sizes and index kept):
    explain gives the same batches; a record whose key is cut is one line naming it."""
    copy = str(tmp_path / "ds")
    shutil.copytree(data, copy)
    before = explain(data, "train", 8, range(5), **OPTS, random_crop=True)
    info = reader.load_info(copy)
    for shard in info.split("train").shards:
        path = os.path.join(copy, shard.file)
        blob = bytearray(open(path, "rb").read())
        start = 0
        while (at := blob.find(b"\x89PNG", start)) >= 0:
            blob[at : at + 40] = b"\xff" * 40
            start = at + 40
        open(path, "wb").write(bytes(blob))
    after = explain(copy, "train", 8, range(5), **OPTS, random_crop=True)
    assert told(after) == told(before)
    assert all((a["box"] == b["box"]).all() for a, b in zip(after, before))


def test_the_explain_command_prints_json_and_a_table(data):
    """``evenshard explain OUT --split train --steps 2:4 --rank 1 --workers 3``."""
    kw = dict(OPTS, num_workers=3, worker_index=1, epochs=2)
    want = explain(data, "train", 6, range(2, 4), **kw)
    cmd = [
        sys.executable,
        "-m",
        "evenshard",
        "explain",
        data,
        "--split",
        "train",
        "--steps",
        "2:4",
        "--rank",
        "1",
        "--workers",
        "3",
        "--batch_size",
        "6",
        "--seed",
        "4",
        "--shuffle_buffer",
        "16",
        "--cycle_length",
        "4",
        "--epochs",
        "2",
    ]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert [b["key"] for b in got] == told(want) and [b["step"] for b in got] == [2, 3]
    table = subprocess.run(cmd, capture_output=True, text=True)
    assert table.returncode == 0 and want[0]["key"][0] in table.stdout
    bad = subprocess.run([*cmd[:-10], "--steps", "2:x"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert np.array_equal(want[0]["epoch"], got[0]["epoch"])


def test_the_explain_command_reads_one_epoch_as_make_dataset_and_says_a_step_past_it(data, capsys):
    """``--steps -3:2`` ended in argparse's "expected one argument"; ``--steps 100:200``
    on a 15-step epoch listed steps 100-199 (the command read endless epochs, the
    readers one). Now the range is judged, and a step past the read's end is one line,
    from the command and from ``explain()`` alike."""
    from evenshard import cli

    base = ["explain", data, "--seed", "4", "--batch_size", "4"]
    assert cli.main([*base, "--steps", "-3:2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "evenshard explain: error: argument --steps: FIRST:STOP with 0 <= FIRST < STOP, "
        "got '-3:2' (see evenshard explain --help)\n"
    )
    last = -(-reader.load_info(data).split("train").num_examples // 4) - 1
    past = (
        f"step {last + 1} is past the end of the read, whose last step is {last}: ask for "
        "earlier steps, or read more epochs (endless: epochs=None, or the command's --epochs 0)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(past)}$"):
        explain(data, "train", 4, range(last, last + 2), seed=4)
    assert cli.main([*base, "--steps", f"{last}:{last + 100}"]) == 1
    assert capsys.readouterr().err == f"evenshard explain: error: {past}\n"
    assert cli.main([*base, "--steps", f"{last}:{last + 2}", "--epochs", "0", "--json"]) == 0
    assert [b["step"] for b in json.loads(capsys.readouterr().out)] == [last, last + 1]


def test_the_explain_command_continues_a_saved_state(data, tmp_path):
    """``--state FILE``: a ReadState's JSON (with a skip), or a reader's state_dict();
    the batch size is the state's unless given."""
    kw = dict(OPTS, num_workers=3, worker_index=1, epochs=2)
    state = reader.ReadState(4, 6, step=1, num_workers=3).skip(2, 3)
    want = explain(data, "train", 6, range(1, 3), state=state, **kw)
    cmd = [
        sys.executable,
        "-m",
        "evenshard",
        "explain",
        data,
        "--steps",
        "1:3",
        "--rank",
        "1",
        "--workers",
        "3",  # no --batch_size: the state's (6)
        "--shuffle_buffer",
        "16",
        "--cycle_length",
        "4",
        "--epochs",
        "2",
        "--json",
        "--state",
    ]
    for i, saved in enumerate((state.to_json(), json.dumps({"read_state": state.to_json()}))):
        path = tmp_path / f"state{i}.json"
        path.write_text(saved)
        done = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert [b["key"] for b in json.loads(done.stdout)] == told(want)


def test_explain_equals_the_dali_pipeline_on_the_cpu(data):
    """DALI (CPU) through TorchReader, rank 1 of 3, crops drawn, from a state that skips
    a step and excludes a key: the keys and masks explained are those it yields."""
    kw = dict(OPTS, epochs=2, num_workers=3, worker_index=1, random_crop=True)
    first = explain(data, "train", 6, range(3), **kw)
    state = reader.ReadState(4, 6, step=1).skip(2, 3).exclude([first[1]["key"][0]])
    dali = [
        as_lists(b) for b in reader.TorchReader(data, "train", 6, backend="dali", state=state, **kw)
    ]
    said = explain(data, "train", 6, range(1, 2 + len(dali)), state=state, **kw)  # 2 skipped
    assert told(said) == [b["key"] for b in dali]
    assert [list(s["mask"]) for s in said] == [b["mask"] for b in dali]


def as_lists(batch) -> dict:
    return {k: v if isinstance(v, list) else np.asarray(v).tolist() for k, v in batch.items()}
