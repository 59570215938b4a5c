"""``DatasetInfo``: dataset_info.json parsed once into frozen, typed values (schemas)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from reader.values.split_shards import default_path_root, split_fingerprint, split_shards
from schemas import layout
from schemas.dataset_info import DatasetInfo, ShardInfo, load_dataset_info, parse_dataset_info
from schemas.info import DatasetError

pytestmark = pytest.mark.fast

SHA = "ab" * 32


def info_dict(**changes) -> dict:
    shard = "train-00000-of-00002.tfrecord"
    info = {
        "format_version": layout.FORMAT_VERSION,
        "record_kind": "path",
        "path_root": "/images",
        "labels": ["a", "b"],
        "formats": ["jpeg", "png"],
        "inputs": 5,
        "rejects": {"total": 0, "by_reason": {}},
        "splits": {
            "train": {
                "num_examples": 5,
                "shards": [
                    {
                        "file": shard,
                        "num_examples": 3,
                        "num_bytes": 90,
                        "sha256": SHA,
                        "dali_index": layout.index_name(shard),
                    },
                    {"file": "train-00001-of-00002.tfrecord", "num_examples": 2, "num_bytes": 60},
                ],
            },
            "val": {"num_examples": 0, "shards": []},
        },
    }
    info.update(changes)
    return info


def test_the_typed_info_holds_what_the_json_lists_and_is_frozen():
    info = parse_dataset_info(json.dumps(info_dict()))
    assert (info.record_kind, info.compression, info.path_root) == ("path", "none", "/images")
    assert info.labels == ("a", "b") and info.formats == ("jpeg", "png")
    assert info.split_names == ("train", "val")
    first, second = info.split("train").shards
    assert first == ShardInfo(
        "train-00000-of-00002.tfrecord", 3, 90, SHA, layout.index_name(first.file)
    )
    assert second.sha256 is None and second.dali_index is None
    assert info.split("val").num_examples == 0 and info.split("val").shards == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.record_kind = "image"


def test_a_missing_split_names_the_splits_there_are():
    info = DatasetInfo.of(info_dict())
    with pytest.raises(DatasetError, match=r"split 'test' not in the dataset; it has train, val"):
        info.split("test")
    with pytest.raises(DatasetError, match=r"split 'test' not in d/; it has train, val"):
        split_shards(info, "d/", "test")


def test_parsing_checks_as_parse_info_does():
    with pytest.raises(DatasetError, match="missing field"):
        parse_dataset_info(json.dumps({"format_version": layout.FORMAT_VERSION}))


def test_the_split_fingerprint_is_the_digest_of_the_listed_shards_as_before():
    """A state saved before the typed info resumes after it: the same 16 hex digits."""
    raw = info_dict()
    shards = [
        [s["file"], s["num_examples"], s.get("sha256", s["num_bytes"])]
        for s in raw["splits"]["train"]["shards"]
    ]
    want = hashlib.sha256(json.dumps(["train", shards]).encode()).hexdigest()[:16]
    assert split_fingerprint(DatasetInfo.of(raw), "train") == want


def test_the_reader_reads_the_shards_and_path_root_from_the_typed_info(tmp_path):
    raw = info_dict()
    for shard in raw["splits"]["train"]["shards"]:
        (tmp_path / shard["file"]).write_bytes(b"x" * shard["num_bytes"])
    (tmp_path / layout.INFO_FILE).write_text(json.dumps(raw))
    info = load_dataset_info(str(tmp_path))
    shards = split_shards(info, str(tmp_path), "train")
    assert [s["num_bytes"] for s in shards] == [90, 60]
    assert shards[0]["sha256"] == SHA and "sha256" not in shards[1]
    assert shards[0]["index"].endswith(
        layout.index_name(raw["splits"]["train"]["shards"][0]["file"])
    )
    assert shards[1]["index"] is None
    assert default_path_root(info, None) == "/images"
    assert default_path_root(DatasetInfo.of(info_dict(record_kind="image")), "/x") is None


def test_split_shards_takes_the_dict_load_info_gives_too(tmp_path):
    raw = info_dict()
    for shard in raw["splits"]["train"]["shards"]:
        (tmp_path / shard["file"]).write_bytes(b"x" * shard["num_bytes"])
    typed = split_shards(DatasetInfo.of(raw), str(tmp_path), "train")
    assert split_shards(raw, str(tmp_path), "train") == typed


def test_reader_load_info_gives_every_field_as_an_attribute(tmp_path):
    """reader.load_info gave the dict (issue 56): every field convert writes is now an
    attribute, typed where it has a type of its own, read-only where it is an object."""
    import reader

    raw = info_dict(
        seed=3,
        input="images/",
        dedupe="near",
        rejects={"total": 2, "by_reason": {"corrupt": 2}, "file": "rejects/rejects.jsonl"},
        near_duplicates={"clusters": 4, "distance": 10},
        split_options={"splits": {"train": 1.0}},
        a_later_field={"x": [1, 2]},
    )
    raw["splits"]["train"]["label_counts"] = {"a": 3, "b": 2}
    raw["splits"]["train"]["num_bytes"] = 150
    (tmp_path / layout.INFO_FILE).write_text(json.dumps(raw))
    info = reader.load_info(str(tmp_path))
    assert isinstance(info, DatasetInfo)
    assert (info.inputs, info.seed, info.input, info.dedupe) == (5, 3, "images/", "near")
    assert (info.rejects.total, dict(info.rejects.by_reason)) == (2, {"corrupt": 2})
    assert info.rejects.file == "rejects/rejects.jsonl"
    assert info.near_duplicates["clusters"] == 4 and info.split_options["splits"]["train"] == 1.0
    assert info.num_examples == 5 and info.split("train").num_bytes == 150
    assert dict(info.split("train").label_counts) == {"a": 3, "b": 2}
    assert info.a_later_field["x"] == (1, 2)  # a field this version has no attribute for
    with pytest.raises(TypeError):
        info.near_duplicates["clusters"] = 5  # read-only
    with pytest.raises(AttributeError, match="no field 'nothing'"):
        _ = info.nothing
    assert info.to_dict() == raw  # the document, a new dict
    assert hash(info) == hash(reader.load_info(str(tmp_path)))


def test_dict_access_still_works_for_a_release_and_warns_naming_the_attribute():
    info = DatasetInfo.of(info_dict())
    with pytest.warns(DeprecationWarning, match=r"info\['splits'\]: .* use info.split\(name\)"):
        assert info["splits"]["train"]["num_examples"] == 5
    with pytest.warns(DeprecationWarning, match=r"use info.inputs"):
        assert info.get("inputs") == 5
    with pytest.warns(DeprecationWarning, match=r"use info.rejects \(.total"):
        assert info["rejects"]["total"] == 0
    with pytest.warns(DeprecationWarning, match=r"info.get\('seed'\)"):
        assert info.get("seed", 7) == 7
    with pytest.warns(DeprecationWarning, match=r"'labels' in info"):
        assert "labels" in info
    with pytest.warns(DeprecationWarning, match=r"use info.to_dict\(\)"):
        assert dict(info.items()) == info_dict()
    with pytest.warns(DeprecationWarning, match=r"iterating over info"):
        assert list(info) == list(info_dict())
    with pytest.warns(DeprecationWarning, match=r"len\(info\)"):
        assert len(info) == len(info_dict())
    with pytest.warns(DeprecationWarning, match=r"info.values\(\)"):
        assert list(info.values()) == list(info_dict().values())
    with pytest.warns(DeprecationWarning, match=r"no such|use info.to_dict\(\) \(a dict\)"):
        assert info.get("num_examples") is None  # not a field: no attribute named for it
    with pytest.raises(AttributeError, match=r"no setdefault\(\): it is no longer a dict"):
        info.setdefault("x", 1)
    with pytest.warns(DeprecationWarning):  # one plain dict, as it was: the user's to change
        info["splits"]["train"]["num_examples"] = 99
    with pytest.warns(DeprecationWarning):
        assert info["splits"]["train"]["num_examples"] == 99
    assert info.split("train").num_examples == 5  # the attributes never change
    assert json.dumps(info.split("train").label_counts) == "{}"  # read-only, still JSON
    with pytest.raises(TypeError, match="read-only"):
        info.split("train").label_counts["a"] = 1


def test_the_typed_info_pickles_as_a_reader_going_to_its_workers_does():
    import pickle

    info = DatasetInfo.of(info_dict(near_duplicates={"clusters": 4}))
    again = pickle.loads(pickle.dumps(info))
    assert again == info and again.near_duplicates["clusters"] == 4
    assert again.to_json() == info.to_json()
