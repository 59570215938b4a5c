"""Readers check the counts they read against dataset_info.json, naming the shard."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from dataset_writer import write_dataset

import reader
from audit.validate import validate
from evenshard import synthetic
from reader.dali import make_dali_pipeline
from reader.torch import TorchReader
from schemas import layout

SIZE = (8, 8)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("counts")
    synthetic.make_image_folder(str(base / "img"), num_labels=2, per_label=12, formats=("png",))
    write_dataset(str(base / "img"), str(base / "plain"), "--splits=train=1.0", "--num_shards=2")
    write_dataset(
        str(base / "img"),
        str(base / "gzip"),
        "--splits=train=1.0",
        "--num_shards=2",
        "--compression=gzip",
    )
    return str(base / "plain"), str(base / "gzip")


def _edited(src, tmp_path, edit):
    out = str(tmp_path / "edited")
    shutil.copytree(src, out)
    path = os.path.join(out, layout.INFO_FILE)
    info = json.load(open(path))
    edit(info, out)
    json.dump(info, open(path, "w"))
    return out


def _lower_count(info, out):
    """One fewer example listed than the first shard holds (the sums kept consistent)."""
    info["splits"]["train"]["shards"][0]["num_examples"] -= 1
    info["splits"]["train"]["num_examples"] -= 1


def _read_all(name, data_dir):
    kw = dict(image_size=SIZE, shuffle=False)
    if name == "tf":
        return sum(1 for _ in reader.make_dataset(data_dir, "train", None, **kw))
    if name == "dali":
        return sum(len(b["key"]) for b in make_dali_pipeline(data_dir, "train", 4, **kw))
    return sum(len(b["key"]) for b in TorchReader(data_dir, "train", 4, backend=name[6:], **kw))


READERS = ["tf", "dali", "torch-tf", "torch-dali"]


@pytest.mark.parametrize("name", READERS)
def test_a_shard_holding_more_records_than_listed_is_refused(datasets, tmp_path, name):
    out = _edited(datasets[0], tmp_path, _lower_count)
    with pytest.raises(reader.DatasetError, match=r"train-00000-of-00002.tfrecord.idx: 12 records"):
        _read_all(name, out)


def test_a_gzip_shard_holding_more_records_than_listed_is_refused(datasets, tmp_path):
    out = _edited(datasets[1], tmp_path, _lower_count)
    with pytest.raises(reader.DatasetError, match="tfrecord.gz holds more records than the 11 "):
        _read_all("tf", out)


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda lines: lines[:3] + lines[2:-1], "does not follow the record before it"),
        (lambda lines: lines[:-1], "11 records indexed"),
        (lambda lines: lines[:-1] + [lines[-1][:4]], "line 12 is not 'offset size'"),
    ],
)
def test_a_damaged_index_is_named(datasets, tmp_path, name, damage, message):
    out = str(tmp_path / "damaged")
    shutil.copytree(datasets[0], out)
    index = os.path.join(out, "train-00000-of-00002.tfrecord.idx")
    lines = open(index).read().splitlines()
    open(index, "w").write("\n".join(damage(lines)) + "\n")
    with pytest.raises(reader.DatasetError, match=message) as e:
        _read_all(name, out)
    assert "train-00000-of-00002.tfrecord.idx" in str(e.value)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda info, _: info["splits"]["train"]["shards"].append(
                info["splits"]["train"]["shards"][0]
            ),
            "is listed twice",
        ),
        (
            lambda info, _: info["splits"]["train"]["shards"][0].update(num_examples=12.0),
            "num_examples is 12.0, not a whole number",
        ),
        (lambda info, _: info.update(compression="gzip"), "does not end in .tfrecord.gz"),
    ],
)
def test_an_edited_info_is_refused_by_readers_and_validate(datasets, tmp_path, edit, message):
    out = _edited(datasets[0], tmp_path, edit)
    with pytest.raises(reader.DatasetError, match=message):
        reader.load_info(out)
    for name in READERS:
        with pytest.raises(reader.DatasetError, match=message):
            _read_all(name, out)
    problems = validate(out, full=True)
    assert len(problems) == 1 and message.split(" not")[0] in problems[0]
