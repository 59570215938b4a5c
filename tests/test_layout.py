"""The format's layout: the shard-name rule and file names (schemas.layout)."""

from __future__ import annotations

import pytest

from schemas import layout

pytestmark = pytest.mark.fast  # the unit lane: make test-fast


def test_shard_names_follow_one_rule():
    assert layout.shard_name("train", 3, 16) == "train-00003-of-00016.tfrecord"
    assert layout.shard_name("val", 0, 1, "gzip") == "val-00000-of-00001.tfrecord.gz"
    for name in ("train-00003-of-00016.tfrecord", "my_split-00000-of-00001.tfrecord.gz"):
        assert layout.is_shard_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "../other/train-00000-of-00001.tfrecord",
        "sub/train-00000-of-00001.tfrecord",
        "train-0000-of-00001.tfrecord",
        "train-00000-of-00001.tfrecord.zst",
        "train-00000-of-00001.tfrecord.tmp-abc",
        "schema.pbtxt",
    ],
)
def test_anything_else_is_not_a_shard_name(name):
    assert not layout.is_shard_name(name)


def test_bad_shard_name_parts_are_refused():
    with pytest.raises(ValueError, match="split name"):
        layout.shard_name("a/b", 0, 1)
    with pytest.raises(ValueError, match=r"not in \[0, 2\)"):
        layout.shard_name("train", 2, 2)
    with pytest.raises(ValueError, match="compression"):
        layout.shard_name("train", 0, 1, "zstd")


def test_claimed_patterns_cover_the_names_convert_writes():
    import fnmatch

    written = [
        layout.shard_name("train", 0, 2),
        layout.shard_name("test", 1, 2, "gzip"),
        layout.SCHEMA_FILE,
        layout.LABELS_FILE,
        layout.REJECTS_FILE,
        f"{layout.INCOMPLETE_DIR}/train-00000-of-00002.tfrecord.1234",
    ]
    for name in written:
        assert any(fnmatch.fnmatch(name, p) for p in layout.CLAIMED_PATTERNS), name
    for name in ("notes.txt", "data.tmp-1", "rejects/mine.txt"):
        assert not any(fnmatch.fnmatch(name, p) for p in layout.CLAIMED_PATTERNS), name


def test_temp_files_are_known_by_their_exact_name():
    token = "0123456789abcdef" * 2
    for name in layout.FIXED_FILES:
        assert layout.is_temp_of_fixed_file(layout.temp_name(name, token))
    for rel in ("data.tmp-1", f"mine.txt.tmp-{token}", f"labels.txt.tmp-{token[:-1]}"):
        assert not layout.is_temp_of_fixed_file(rel), rel


def test_join_works_for_folders_and_urls():
    assert layout.join("/data/out/", layout.INFO_FILE) == "/data/out/dataset_info.json"
    assert layout.join("gs://b/out", "x") == "gs://b/out/x"
