"""evenshard validate / inspect, and TFX interop through tfx-bsl, on converted datasets."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import load_info
from dataset_writer import write_dataset

import schemas
from evenshard import cli, synthetic
from schemas import tfrecord
from schemas.example import serialize_example
from schemas.example_check import check_examples


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("validate")
    images = str(base / "images")
    synthetic.make_image_folder(images, num_labels=3, per_label=40, formats=("jpeg", "png", "webp"))
    image_dir, path_dir = str(base / "image_ds"), str(base / "path_ds")
    write_dataset(images, image_dir, "--num_shards=2")
    write_dataset(images, path_dir, "--num_shards=2", "--record_kind=path", "--compression=gzip")
    return image_dir, path_dir


def damaged(src: str, tmp_path) -> str:
    out = str(tmp_path / "damaged")
    shutil.copytree(src, out)
    return out


def first_shard(data_dir: str) -> str:
    return os.path.join(data_dir, load_info(data_dir)["splits"]["train"]["shards"][0]["file"])


@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("full", [False, True])
def test_fresh_datasets_are_valid(datasets, kind, full, capsys):
    assert cli.main(["validate", datasets[kind]] + (["--full"] if full else [])) == 0
    assert "is valid" in capsys.readouterr().out


def flip_byte(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(path, "wb").write(bytes(data))


DAMAGE = {
    "flipped byte": (flip_byte, ["sha256 differs", "checksum mismatch"]),
    "deleted shard": (os.remove, ["listed in dataset_info.json but missing"]),
    "truncated shard": (
        lambda p: open(p, "r+b").truncate(os.path.getsize(p) - 10),
        ["bytes, dataset_info.json records", "file ends inside a record"],
    ),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_damage_is_reported_naming_the_file(datasets, tmp_path, capsys, name):
    data_dir = damaged(datasets[0], tmp_path)
    shard = first_shard(data_dir)
    action, messages = DAMAGE[name]
    action(shard)
    assert cli.main(["validate", data_dir]) == 1
    out = capsys.readouterr().out.splitlines()
    for message in messages:
        assert any(line.startswith(shard) and message in line for line in out), out


def test_the_index_of_a_corrupt_shard_names_each_count_rightly(datasets, tmp_path, capsys):
    """A shard corrupt mid-way (its size kept) read "X.idx: ... 24 records indexed,
    dataset_info.json lists 12" where dataset_info.json lists 24 and 12 could be read.
    The index is checked as the readers use it, against the count listed and the shard's
    size, and against the records that could be read: here it describes both."""
    data_dir = damaged(datasets[0], tmp_path)
    shard = first_shard(data_dir)
    listed = load_info(data_dir)["splits"]["train"]["shards"][0]["num_examples"]
    flip_byte(shard)
    assert cli.main(["validate", data_dir]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{shard}: ") and "readable records" in line for line in out)
    assert not [line for line in out if line.startswith(f"{shard}.idx")], out
    index = f"{shard}.idx"
    lines = open(index).read().splitlines(keepends=True)
    open(index, "w").write("".join(lines[:-1]))  # and the index short of its last line
    assert cli.main(["validate", data_dir]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith(index)] == [
        f"{index}: does not match the records of {shard}: {listed - 1} records indexed, "
        f"dataset_info.json lists {listed} (rewrite it or convert again)"
    ]


def test_stray_shard_and_edited_count_are_reported(datasets, tmp_path, capsys):
    data_dir = damaged(datasets[0], tmp_path)
    stray = os.path.join(data_dir, "train-00007-of-00009.tfrecord")
    shutil.copy(first_shard(data_dir), stray)
    os.mkdir(os.path.join(data_dir, ".incomplete"))  # a temp shard, of a run that died
    open(os.path.join(data_dir, ".incomplete", "train-00000-of-00002.tfrecord.0a"), "w").close()
    info_path = os.path.join(data_dir, "dataset_info.json")
    info = load_info(data_dir)
    info["splits"]["val"]["shards"][0]["num_examples"] += 1
    info["splits"]["val"]["num_examples"] += 1
    open(info_path, "w").write(json.dumps(info))
    assert cli.main(["validate", data_dir]) == 1
    out = capsys.readouterr().out
    assert f"{stray}: stray shard file" in out
    assert f"{data_dir}/.incomplete: 1 file(s) of a run that did not finish" in out
    val_shard = os.path.join(data_dir, info["splits"]["val"]["shards"][0]["file"])
    assert f"{val_shard}: " in out and "readable records, dataset_info.json records" in out
    # a split count that is not the sum of its shards' stops the parse: one line
    info["splits"]["val"]["num_examples"] += 1
    open(info_path, "w").write(json.dumps(info))
    assert cli.main(["validate", data_dir]) == 1
    out = capsys.readouterr().out
    assert "num_examples" in out and "not the sum of its shards" in out


def test_gzip_damage_is_reported(datasets, tmp_path, capsys):
    data_dir = damaged(datasets[1], tmp_path)
    shard = first_shard(data_dir)
    flip_byte(shard)
    assert cli.main(["validate", data_dir]) == 1
    assert any(line.startswith(shard) for line in capsys.readouterr().out.splitlines())


def test_missing_info_and_usage_errors(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path)]) == 1
    assert "dataset_info.json not found" in capsys.readouterr().out
    assert cli.main(["validate", "--bogus"]) == 2


def test_crafted_records_are_reported_with_their_index(datasets):
    schema = schemas.load(datasets[0])
    good = next(tfrecord.iter_records(first_shard(datasets[0])))
    base = {
        "image/encoded": b"x",
        "image/format": "jpeg",
        "image/height": 2,
        "image/width": 2,
        "image/channels": 3,
        "image/class/label": 1,
        "image/class/text": "label_1",
        "image/key": "k",
    }
    wrong_type = serialize_example({**base, "image/height": "tall"})
    missing = serialize_example({k: v for k, v in base.items() if k != "image/key"})
    out_of_domain = serialize_example({**base, "image/class/label": 7})
    extra = serialize_example({**base, "image/extra": 1})
    two_values = _example_with_two_heights(base)
    records = [good, wrong_type, good, missing, out_of_domain, extra, two_values]
    problems = dict(check_examples(records, schema, first_index=100))
    assert sorted(problems) == [101, 103, 104, 105, 106]
    assert "image/height: has 2 values, the schema says 1" in problems[106]
    assert "does not parse" in problems[101]
    assert "image/key: missing" in problems[103]
    assert "image/class/label: value 7 outside the domain [0, 2]" in problems[104]
    assert "extra feature image/extra" in problems[105]


def _example_with_two_heights(features: dict) -> bytes:
    import tensorflow as tf

    def feature(v):
        if isinstance(v, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        v = v.encode() if isinstance(v, str) else v
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    feats = {k: feature(v) for k, v in features.items()}
    feats["image/height"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[2, 3]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def test_full_validation_reports_a_bad_record_in_a_shard(datasets, tmp_path, capsys):
    data_dir = damaged(datasets[0], tmp_path)
    shard = first_shard(data_dir)
    records = list(tfrecord.iter_records(shard))
    bad = {
        "image/encoded": b"not an image",
        "image/format": "jpeg",
        "image/height": 2,
        "image/width": 2,
        "image/channels": 3,
        "image/class/label": 0,
        "image/class/text": "label_0",
        "image/key": "bad",
    }
    records[3] = serialize_example(bad)
    with open(shard, "wb") as f:
        for r in records:
            f.write(tfrecord.frame(r))
    assert cli.main(["validate", data_dir, "--full"]) == 1
    out = capsys.readouterr().out
    assert f"{shard}: record 3: image does not decode" in out


def test_feature_spec_round_trip_on_real_records(datasets):
    import tensorflow as tf

    schema = schemas.load(datasets[0])
    spec = schemas.feature_spec(schema)
    records = list(tfrecord.iter_records(first_shard(datasets[0])))[:8]
    parsed = tf.io.parse_example(tf.constant(records), spec)
    assert set(parsed) == {f.name for f in schema.feature}
    assert parsed["image/class/label"].shape == (8, 1)
    info = load_info(datasets[0])
    for i, record in enumerate(records):
        ex = tf.train.Example.FromString(record).features.feature
        assert parsed["image/key"][i, 0].numpy() == ex["image/key"].bytes_list.value[0]
        label = int(parsed["image/class/label"][i, 0])
        assert info["labels"][label] == parsed["image/class/text"][i, 0].numpy().decode()


@pytest.mark.parametrize("kind", [0, 1])
def test_tfxio_reads_the_shards(datasets, kind):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that
    from tfx_bsl.public import tfxio

    data_dir = datasets[kind]
    info = load_info(data_dir)
    files = [os.path.join(data_dir, s["file"]) for s in info["splits"]["train"]["shards"]]
    schema = schemas.load(data_dir)
    source = tfxio.TFExampleRecord(file_pattern=files, schema=schema)
    n = info["splits"]["train"]["num_examples"]
    ds = source.TensorFlowDataset(tfxio.TensorFlowDatasetOptions(batch_size=16, num_epochs=1))
    assert sum(int(b["image/key"].shape[0]) for b in ds) == n

    def check(batches):
        assert sum(b.num_rows for b in batches) == n
        assert "image/class/label" in batches[0].schema.names

    with beam.Pipeline() as p:
        assert_that(
            p | source.BeamSource(batch_size=32) | beam.combiners.ToList() | beam.Map(lambda x: x),
            lambda got: check(got[0]),
        )


def test_inspect_summarizes(datasets, capsys):
    assert cli.main(["inspect", datasets[0]]) == 0
    text = capsys.readouterr().out
    assert "rejects: 0" in text and "{" not in text  # tables, not dicts
    header = next(line for line in text.splitlines() if line.strip().startswith("label "))
    assert header.split() == ["label", "test", "train", "val"]
    assert "label_2" in text
    assert cli.main(["inspect", datasets[1], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["record_kind"] == "path" and data["written"] == 120
    assert data["splits"]["train"]["num_shards"] == 2
    for split, labels in data["missing_labels"].items():  # flagged iff a count is 0
        assert all(not data["splits"][split]["label_counts"].get(x) for x in labels)


def test_inspect_flags_labels_missing_from_a_split(datasets, tmp_path, capsys):
    data_dir = damaged(datasets[0], tmp_path)
    info = load_info(data_dir)
    info["splits"]["val"]["label_counts"]["label_1"] = 0
    with open(os.path.join(data_dir, "dataset_info.json"), "w") as f:
        json.dump(info, f)
    assert cli.main(["inspect", data_dir]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.strip().startswith("label_1 "))
    assert row.split()[-1] == "MISSING"
    assert "! split val has no examples of: label_0, label_1" in text


def test_validate_full_of_moved_path_records_summarizes_then_takes_path_root(
    datasets, tmp_path, capsys
):
    data_dir = damaged(datasets[1], tmp_path)
    info = load_info(data_dir)
    moved = tmp_path / "moved"
    shutil.move(info["path_root"], moved)
    try:
        # bounded whatever --max_problems: 10 images named, a count, and the fix
        assert cli.main(["validate", data_dir, "--full", "--max_problems=0"]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"evenshard validate: 11 problem(s) in {data_dir}"
        assert len(lines) == 12 and all(line.endswith("is missing") for line in lines[1:11])
        assert lines[-1] == (
            f"{info['path_root']}: 120 image(s) of path records missing here (10 named "
            "above); if the images moved, pass --path_root=THEIR_NEW_FOLDER"
        )
        # without --full too: a path dataset whose images are gone is not valid
        assert cli.main(["validate", data_dir]) == 1
        assert "problem(s)" in capsys.readouterr().out
        assert cli.main(["validate", data_dir, "--full", f"--path_root={moved}"]) == 0
    finally:
        shutil.move(moved, info["path_root"])


def test_validate_full_decodes_the_images_of_path_records(datasets, tmp_path, capsys):
    data_dir = damaged(datasets[1], tmp_path)
    root = tmp_path / "root"
    shutil.copytree(load_info(data_dir)["path_root"], root)
    victim = sorted((root / "label_0").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:40])  # cut: the header stays, the body goes
    assert cli.main(["validate", data_dir, f"--path_root={root}"]) == 0  # it exists
    capsys.readouterr()
    assert cli.main(["validate", data_dir, "--full", f"--path_root={root}"]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "does not decode" in out
