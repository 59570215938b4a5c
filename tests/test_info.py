"""The one dataset_info.json parser (schemas.info)."""

from __future__ import annotations

import json

import pytest

from schemas import layout
from schemas.info import DatasetError, load_info, parse_info

pytestmark = pytest.mark.fast  # the unit lane: make test-fast


def _info(**changes):
    info = {
        "format_version": layout.FORMAT_VERSION,
        "record_kind": "image",
        "labels": ["a", "b"],
        "inputs": 3,
        "rejects": {"total": 0, "by_reason": {}},
        "splits": {
            "train": {
                "num_examples": 3,
                "shards": [
                    {"file": "train-00000-of-00001.tfrecord", "num_examples": 3, "num_bytes": 90}
                ],
            }
        },
    }
    info.update(changes)
    return json.dumps(info)


def _shard(**changes):
    shard = {"file": "train-00000-of-00001.tfrecord", "num_examples": 3, "num_bytes": 90}
    return _info(splits={"train": {"num_examples": 3, "shards": [{**shard, **changes}]}})


def _twice():
    shard = {"file": "train-00000-of-00002.tfrecord", "num_examples": 3, "num_bytes": 90}
    return _info(splits={"train": {"num_examples": 6, "shards": [shard, shard]}})


def test_a_good_info_parses():
    assert parse_info(_info())["labels"] == ["a", "b"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"format_version": 1}), "missing field"),
        (_info(format_version=99), "format_version 99"),
        (
            _info(splits={"train": {"shards": [{"file": "../x/train-00000-of-00001.tfrecord"}]}}),
            "not a plain shard file name",
        ),
        (_info(splits={"train": {"shards": [{"file": "/etc/passwd"}]}}), "not a plain shard"),
        (_twice(), "shard train-00000-of-00002.tfrecord is listed twice"),
        (_shard(num_examples=25.0), "num_examples is 25.0, not a whole number"),
        (_shard(num_examples="25"), "num_examples is '25', not a whole number"),
        (_shard(num_bytes=True), "num_bytes is True, not a whole number"),
        (_info(compression="gzip"), "does not end in .tfrecord.gz"),
        (_info(compression="zip"), "compression 'zip' is not one of"),
        (_shard(num_examples=2), "num_examples 3 is not the sum of its shards' \\(2\\)"),
        (_shard(dali_index="../../x.idx"), "dali_index '../../x.idx' is not"),
        (_shard(sha256="../victim/x"), "shard train-00000-of-00001.tfrecord: sha256 '../victim/x'"),
        (_shard(sha256="/home/someone/x"), "sha256 '/home/someone/x' is not 64 lowercase hex"),
        (_shard(sha256=12345), "sha256 12345 is not 64 lowercase hex digits"),
        (_shard(sha256="AB" * 32), "is not 64 lowercase hex digits"),
        (_shard(sha256="ab" * 31), "is not 64 lowercase hex digits"),
        (_shard(sha256="ab" * 32 + "\n"), "is not 64 lowercase hex digits"),
    ],
)
def test_a_bad_info_is_a_dataset_error_naming_the_file(text, message):
    with pytest.raises(DatasetError, match=message) as e:
        parse_info(text, "somewhere/dataset_info.json")
    assert "somewhere/dataset_info.json" in str(e.value)


def test_a_listed_sha256_is_a_digest_and_a_long_one_is_cut_in_the_message():
    assert parse_info(_shard(sha256="0123456789abcdef" * 4))
    with pytest.raises(DatasetError) as e:
        parse_info(_shard(sha256="x" * 5000))
    assert len(str(e.value)) < 300 and "\n" not in str(e.value)


def test_load_info_says_what_a_folder_is_missing(tmp_path):
    with pytest.raises(DatasetError, match="not a finished evenshard dataset$"):
        load_info(str(tmp_path))
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    with pytest.raises(DatasetError, match="did not finish: run it again"):
        load_info(str(tmp_path))
    (tmp_path / layout.INFO_FILE).write_text(_info())
    assert load_info(str(tmp_path))["inputs"] == 3
