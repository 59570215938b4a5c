"""A TFDS-prepared dataset as convert's input (issue 42): prepared by
``tensorflow-datasets`` itself, converted (one split or all), and read back with
``reader.make_dataset``."""

from __future__ import annotations

import functools
import os

import pytest
from conftest import assert_multi_process_gives_the_same_bytes, read_rejects, run_convert
from test_tfrecord_input import pngs, read_back

from beam_jobs import convert
from convert_core.options import UserError

FLAGS = ["--input_format=tfds", "--num_shards=2", "--max_reject_fraction=0.5"]
NAMES = ["cat", "dog", "owl"]
SPLITS = {"train": range(0, 12), "test": range(12, 18)}


def label_of(i: int) -> int:
    return i * 3 // 18  # in order of generation: label-sorted


@functools.cache  # one class a source folder (not registered: two folders, two classes)
def small_builder(src):
    """A TFDS builder of the 18 PNGs in ``src`` (train 12, test 6)."""
    import tensorflow_datasets as tfds

    class Small(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = {
                "image": tfds.features.Image(encoding_format="png"),
                "label": tfds.features.ClassLabel(names=NAMES),
                "id": tfds.features.Text(),
            }
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features)
            )

        def _split_generators(self, dl_manager):
            return {name: self._generate_examples(ids) for name, ids in SPLITS.items()}

        def _generate_examples(self, ids):
            for i in ids:
                yield i, {"image": str(src / f"{i}.png"), "label": label_of(i), "id": f"img-{i}"}

    return Small


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for i, image in enumerate(pngs(18)):
        (src / f"{i}.png").write_bytes(image)
    return src


@pytest.fixture(scope="module")
def prepared(src, tmp_path_factory):
    """The dataset prepared by TFDS: its version folder."""
    data_dir = tmp_path_factory.mktemp("tfds")
    small_builder(src)(data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir / "small" / "1.0.0")


def test_all_splits_convert_and_read_back_once(prepared, tmp_path):
    out = str(tmp_path / "out")
    info = run_convert(prepared, out, *FLAGS)
    assert info["inputs"] == 18 and info["rejects"]["total"] == 0
    assert info["labels"] == NAMES  # the ClassLabel names TFDS wrote
    got = read_back(out)
    assert sum(got.values()) == 18 and set(got.values()) == {1}
    files = {"small-train.tfrecord-00000-of-00001": 12, "small-test.tfrecord-00000-of-00001": 6}
    assert {k.split("#")[0] for k, _ in got} == set(files)
    # every label once per id: the labels TFDS stored, by the names
    assert sorted(y for _, y in got) == sorted(label_of(i) for i in range(18))


def test_one_split_and_keys_by_flag(prepared, tmp_path):
    out = str(tmp_path / "out")
    info = run_convert(prepared, out, *FLAGS, "--input_split=test", "--key_feature=id")
    assert info["inputs"] == 6
    assert read_back(out) == {(f"img-{i}", label_of(i)): 1 for i in SPLITS["test"]}


def test_a_damaged_shard_gives_named_rejects_and_counts_reconcile(prepared, tmp_path):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(prepared, copy)
    shard = f"{copy}/small-train.tfrecord-00000-of-00001"
    with open(shard, "r+b") as f:  # cut inside its last records
        f.truncate(os.path.getsize(shard) - 40)
    out = str(tmp_path / "out")
    info = run_convert(copy, out, *FLAGS, "--input_split=train")
    [reject] = read_rejects(out)
    assert reject["key"] == "small-train.tfrecord-00000-of-00001#11"
    assert reject["reason"] == "truncated"
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert info["inputs"] == written + 1 == 12


def test_in_memory_and_multi_process_give_the_same_bytes(prepared, tmp_path):
    assert_multi_process_gives_the_same_bytes(prepared, tmp_path, *FLAGS, "--balance=label")


def test_mistakes_are_one_line(prepared, src, tmp_path):
    argv = [f"--output_dir={tmp_path / 'out'}", "--input_format=tfds"]
    with pytest.raises(UserError, match="no split 'validation'.*: test, train"):
        convert.run([f"--input={prepared}", *argv, "--input_split=validation"])
    with pytest.raises(UserError, match="no dataset_info.json"):
        convert.run([f"--input={tmp_path}", *argv])
    with pytest.raises(UserError, match="--input_split"):
        convert.run([f"--input={tmp_path}", f"--output_dir={tmp_path / 'o'}", "--input_split=x"])
    small_builder(src)(
        data_dir=str(tmp_path / "ar"), file_format="array_record"
    ).download_and_prepare()
    with pytest.raises(UserError, match="in array_record files; only tfrecord"):
        convert.run([f"--input={tmp_path}/ar/small/1.0.0", *argv])


@pytest.mark.slow
def test_a_dataset_in_a_bucket(prepared, bucket, tmp_path):
    """A TFDS version folder in gs:// or s3://: its JSON files and class names read
    there, the test split's shard read through Beam's file systems."""
    url = bucket.upload(prepared, "small/1.0.0")
    out = str(tmp_path / "out")
    info = run_convert(url, out, *FLAGS, "--input_split=test", "--key_feature=id")
    assert info["inputs"] == 6 and info["labels"] == NAMES
    assert read_back(out) == {(f"img-{i}", label_of(i)): 1 for i in SPLITS["test"]}


@pytest.mark.fast
def test_json_files_that_are_not_objects_are_one_line(tmp_path):
    """A dataset_info.json or features.json holding JSON but no object (a list, a
    number) is the one line of a file that is not JSON (was: AttributeError)."""
    from beam_jobs import tfds_source

    (tmp_path / "dataset_info.json").write_text("[]")
    with pytest.raises(UserError, match="dataset_info.json is not a JSON object") as e:
        tfds_source.check(str(tmp_path), None)
    assert "\n" not in str(e.value)
    (tmp_path / "dataset_info.json").write_text("{}")
    (tmp_path / "features.json").write_text("3")
    with pytest.raises(UserError, match="features.json is not a JSON object"):
        tfds_source.check(str(tmp_path), None)
