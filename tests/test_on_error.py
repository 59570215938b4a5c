"""Issue 45.3: a record that cannot be read mid-epoch (its bytes damaged after convert):
``on_error="skip"`` gives its row as a padding row on the Python faces, writes it once
an occurrence to the ledger (key, shard, offset, reason, epoch, step), the same on every
read, and stops at ``max_errors`` in one line; "raise" (the default) stops at it."""

from __future__ import annotations

import json
import shutil

import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.split_shards import load_index, split_shards

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
    shard = {**split_shards(reader.load_info(bad), bad, "train")[0]}
    offset, size = (int(v) for v in load_index(shard)[3])
    with open(shard["path"], "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return good, bad, shard["path"], offset


def same(example, rng):
    return example


def read(data, **kw):
    r = reader.NumpyReader(data, "train", 4, transform=same, num_processes=0, **OPTS, **kw)
    return [list(b["key"]) for b in r]


def test_a_damaged_record_is_a_padding_row_written_once_to_the_ledger(damaged, tmp_path):
    good, bad, path, offset = damaged
    with pytest.raises(reader.DatasetError, match="corrupt") as e:
        read(bad)
    assert "\n" not in str(e.value)
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
    with pytest.raises(ValueError, match="tf.data") as e:
        reader.make_dataset(good, "train", 4, on_error="skip", error_ledger=str(tmp_path / "l"))
    assert "NumpyReader" in str(e.value)
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
