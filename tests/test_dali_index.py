"""DALI index files beside uncompressed shards (issue 12, part 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import load_info, run_convert
from dataset_writer import write_dataset

from audit import validate


@pytest.fixture(scope="module")
def converted(folder_500, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("idx"))
    write_dataset(folder_500[0], out, "--num_shards=3")
    return out


def test_indexes_equal_dalis_tfrecord2idx_byte_for_byte(converted, tmp_path):
    tool = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    info = load_info(converted)
    shards = [sh for s in info["splits"].values() for sh in s["shards"]]
    assert len(shards) == 9
    assert all(sh["dali_index"] == sh["file"] + ".idx" for sh in shards)
    pairs = [
        (os.path.join(converted, sh["file"]), str(tmp_path / sh["dali_index"])) for sh in shards
    ]
    # DALI's tool, every shard in one process, with TensorFlow hidden: the tool then
    # reads with open(), its own fallback (importing TensorFlow for each shard was
    # nearly all of this test's time)
    subprocess.run(
        [sys.executable, "-c", _RUN_TOOL, tool, *(path for pair in pairs for path in pair)],
        check=True,
    )
    for shard in shards:
        with open(os.path.join(converted, shard["dali_index"]), "rb") as f:
            assert f.read() == (tmp_path / shard["dali_index"]).read_bytes()


_RUN_TOOL = """
import runpy, sys
sys.modules["tensorflow"] = None
tool, paths = sys.argv[1], sys.argv[2:]
for shard, index in zip(paths[::2], paths[1::2]):
    sys.argv = [tool, shard, index]
    runpy.run_path(tool, run_name="__main__")
"""


def test_validate_checks_the_indexes(converted, tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(converted, out)
    assert validate.validate(out) == []
    shard = load_info(out)["splits"]["train"]["shards"][0]
    path = os.path.join(out, shard["dali_index"])
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"1")  # first offset 0 -> 1
    assert any("does not match the records" in p for p in validate.validate(out))
    os.remove(path)
    assert any(
        p.endswith("listed in dataset_info.json but missing") for p in validate.validate(out)
    )


def test_compressed_shards_get_none(folder_500, tmp_path):
    out = str(tmp_path / "gz")
    info = run_convert(folder_500[0], out, "--num_shards=2", "--compression=gzip")
    shards = [sh for s in info["splits"].values() for sh in s["shards"]]
    assert shards and not any("dali_index" in sh for sh in shards)
    assert not [n for n in os.listdir(out) if n.endswith(".idx")]
