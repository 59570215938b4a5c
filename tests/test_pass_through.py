"""--record_kind example (issue 42, item 2): tf.train.Examples that are not images,
written by TensorFlow's own writer, converted as they are (shuffled, split, balanced),
their schema inferred, and read back byte for byte."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
from conftest import assert_multi_process_gives_the_same_bytes, load_info, read_rejects, run_convert
from test_tfrecord_input import write_records  # the TensorFlow writer the record tests share

from audit.validate import validate
from beam_jobs import convert
from convert_core.options import UserError

FLAGS = ["--input_format=tfrecord", "--record_kind=example", "--num_shards=2"]


def example(**features) -> bytes:
    """A tf.train.Example: an int, a float, bytes or text is a list of one; a numpy array
    a list of its kind (int64 or float32), empty too; a list a list of texts."""
    import tensorflow as tf

    def feature(value):
        if isinstance(value, np.ndarray) and value.dtype.kind == "i" or isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=np.atleast_1d(value)))
        if isinstance(value, (np.ndarray, float)):
            return tf.train.Feature(float_list=tf.train.FloatList(value=np.atleast_1d(value)))
        values = value if isinstance(value, list) else [value]  # a list: of texts
        values = [v.encode() if isinstance(v, str) else v for v in values]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))

    found = {name: feature(v) for name, v in features.items()}
    return tf.train.Example(features=tf.train.Features(feature=found)).SerializeToString()


def mixed(n: int, seed: int = 0) -> list[bytes]:
    """Examples of a mix of features: a text id and label, ints and floats of varying
    length (an empty list too), raw bytes, and a feature only some records hold."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        features = {
            "id": f"ex-{i}",
            "label": "cat" if i < n // 2 else "dog",  # label-sorted, as the seed's files
            "tokens": rng.integers(-(2**40), 2**40, size=i % 5),
            "embedding": rng.standard_normal(3).astype(np.float32),
            "blob": bytes(rng.integers(0, 256, size=1 + i % 7, dtype=np.uint8)),
            "tags": [f"t{j}" for j in range(1 + i % 3)],
        }
        if i % 3 == 0:
            features["weight"] = float(np.float32(i / 7))
        out.append(example(**features))
    return out


def shard_records(out: str) -> dict[str, list[bytes]]:
    """The serialized records of each split's shards, in file order."""
    import tensorflow as tf

    info = load_info(out)
    return {
        split: [
            r.numpy()
            for shard in s["shards"]
            for r in tf.data.TFRecordDataset(os.path.join(out, shard["file"]))
        ]
        for split, s in info["splits"].items()
    }


def as_python(record: bytes) -> dict:
    """A record's features as TensorFlow parses them: {name: list of values}."""
    import tensorflow as tf

    out = {}
    for name, f in tf.train.Example.FromString(record).features.feature.items():
        kind = f.WhichOneof("kind")
        out[name] = list(getattr(f, kind).value) if kind else None
    return out


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """40 mixed examples in 4 files, label-sorted."""
    root = str(tmp_path_factory.mktemp("examples") / "in")
    recs = mixed(40)
    for f in range(4):
        write_records(f"{root}/part-{f}.tfrecord", recs[f * 10 : f * 10 + 10])
    return root, recs


def test_pass_through_records_round_trip_byte_identical_features(records, tmp_path):
    root, recs = records
    out = str(tmp_path / "out")
    flags = [*FLAGS, "--label_feature=label", "--key_feature=id", "--balance=label"]
    info = run_convert(root, out, *flags)  # validate --full passes (run_convert checks)
    assert info["record_kind"] == "example" and info["label_feature"] == "label"
    assert info["inputs"] == 40 and info["rejects"]["total"] == 0
    assert info["labels"] == ["cat", "dog"] and info["formats"] == []
    written = shard_records(out)
    # the records are the inputs' bytes, each once
    assert collections.Counter(r for rs in written.values() for r in rs) == collections.Counter(
        recs
    )
    # and every feature value is the one written
    by_id = {as_python(r)["id"][0]: as_python(r) for r in recs}
    for r in (r for rs in written.values() for r in rs):
        got = as_python(r)
        assert got == by_id[got["id"][0]]
    # shuffled: not in the input's order; balanced: each shard holds both labels
    assert written["train"] != [r for r in recs if r in written["train"]]
    for split in info["splits"].values():
        for shard in split["shards"]:
            counts = shard["label_counts"]
            if shard["num_examples"] >= 4:
                assert abs(counts.get("cat", 0) - counts.get("dog", 0)) <= 1, counts


def test_the_schema_is_inferred_from_the_records(records, tmp_path):
    from tensorflow_metadata.proto.v0 import schema_pb2

    import schemas

    root, _ = records
    out = str(tmp_path / "out")
    run_convert(root, out, *FLAGS)
    found = {f.name: f for f in schemas.load(out).feature}
    assert sorted(found) == ["blob", "embedding", "id", "label", "tags", "tokens", "weight"]
    types = {n: schema_pb2.FeatureType.Name(f.type) for n, f in found.items()}
    assert types == {
        "blob": "BYTES",
        "embedding": "FLOAT",
        "id": "BYTES",
        "label": "BYTES",
        "tags": "BYTES",
        "tokens": "INT",
        "weight": "FLOAT",
    }
    assert [d.size for d in found["embedding"].shape.dim] == [3]
    assert found["id"].presence.min_fraction == 1.0
    assert (found["tokens"].value_count.min, found["tokens"].value_count.max) == (0, 4)
    assert [d.size for d in found["blob"].shape.dim] == [1]  # one value, of any length
    assert (found["tags"].value_count.min, found["tags"].value_count.max) == (1, 3)
    # weight: in one record of three, one value each
    assert found["weight"].presence.min_fraction == 0.0
    assert found["weight"].presence.min_count == 1
    assert (found["weight"].value_count.min, found["weight"].value_count.max) == (1, 1)
    # tfx-bsl's spec of it: fixed-length where a shape is, else variable
    spec = schemas.feature_spec(schemas.load(out))
    assert type(spec["embedding"]).__name__ == "FixedLenFeature"
    assert type(spec["tokens"]).__name__ == "VarLenFeature"
    # the reader's spec of it, and a shard's records parsed by it (nothing decoded)
    from reader.examples import load_spec, parse_batch

    parsed = parse_batch(shard_records(out)["train"], load_spec(out))
    assert parsed["embedding"].shape[1:] == (3,) and parsed["tags"].lengths.max() == 3
    # no images: evenshard leaks says so in one line
    from audit.leaks import Side
    from schemas.info import DatasetError

    with pytest.raises(DatasetError, match="example records hold no images"):
        Side(out)


def test_without_a_label_and_a_group_stays_in_one_split(records, tmp_path):
    root, recs = records
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS, "--group_by=label", "--splits=a=0.5,b=0.5")
    assert info["labels"] == [] and info["label_feature"] is None
    assert info["split_options"]["group_by"] == "label"
    assert all(not s["label_counts"] for s in info["splits"].values())
    assert (tmp_path / "out" / "labels.txt").read_text() == ""
    written = shard_records(out)
    splits_of = collections.defaultdict(set)  # a label is one group: in one split
    for split, rs in written.items():
        for r in rs:
            splits_of[as_python(r)["label"][0]].add(split)
    assert sorted(splits_of) == [b"cat", b"dog"]
    assert all(len(s) == 1 for s in splits_of.values()), splits_of
    assert sum(map(len, written.values())) == 40


def test_damaged_files_give_named_rejects_and_counts_reconcile(tmp_path):
    root = str(tmp_path / "in")
    recs = mixed(12)
    write_records(f"{root}/good.tfrecord.gz", recs[:4])  # gzip: read again once a shard
    write_records(f"{root}/cut.tfrecord", recs[4:8])
    with open(f"{root}/cut.tfrecord", "r+b") as f:  # cut inside record 3
        f.truncate(os.path.getsize(f"{root}/cut.tfrecord") - 5)
    write_records(f"{root}/notexample.tfrecord", [b"\xff\xff not an Example", *recs[8:10]])
    with open(f"{root}/text.tfrecord", "w") as f:
        f.write("not records at all, but long enough to hold a header\n")
    write_records(f"{root}/nolabel.tfrecord", [example(id="x", other=1), recs[10]])
    out = str(tmp_path / "out")
    flags = [*FLAGS, "--label_feature=label", "--max_reject_fraction=0.5"]
    info = run_convert(root, out, *flags)
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {
        ("cut.tfrecord#3", "truncated"),
        ("notexample.tfrecord#0", "corrupt"),
        ("text.tfrecord#0", "corrupt"),
        ("nolabel.tfrecord#0", "bad_label"),
    }
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert written == 4 + 3 + 2 + 1
    assert info["inputs"] == written + info["rejects"]["total"] == 14
    kept = collections.Counter(r for rs in shard_records(out).values() for r in rs)
    assert kept == collections.Counter([*recs[:7], *recs[8:11]])


@pytest.mark.slow
def test_in_memory_and_multi_process_give_the_same_bytes(records, tmp_path):
    root, _ = records
    flags = [*FLAGS, "--label_feature=label", "--balance=label"]
    assert_multi_process_gives_the_same_bytes(root, tmp_path, *flags)


def test_a_feature_of_two_kinds_is_a_validation_finding(tmp_path):
    root = str(tmp_path / "in")
    recs = [example(id=f"r{i}", x=i) for i in range(5)] + [example(id="odd", x="text")]
    write_records(f"{root}/r.tfrecord", recs)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS, validated=False)
    assert info["inputs"] == 6 and info["rejects"]["total"] == 0  # written as they are
    problems = validate(out, full=True)
    assert len(problems) == 1 and "bytes values, the schema says int64" in problems[0]
    assert validate(out) == []  # the quick check reads no schema


@pytest.mark.fast
def test_flags_of_the_example_kind_are_one_line(tmp_path):
    base = ["--input=x", "--output_dir=y", "--record_kind=example"]
    with pytest.raises(UserError, match="--input_format=tfrecord or tfds"):
        convert.run([*base, "--input_format=parquet"])
    with pytest.raises(UserError, match="--image_feature"):
        convert.run([*base, "--input_format=tfrecord", "--image_feature=img"])
    with pytest.raises(UserError, match="needs --label_feature"):
        convert.run([*base, "--input_format=tfrecord", "--balance=label"])
    with pytest.raises(UserError, match="--dedupe content"):
        convert.run([*base, "--input_format=tfrecord", "--dedupe=near"])


def test_a_named_feature_the_first_record_lacks_is_one_line(tmp_path):
    root = str(tmp_path / "in")
    write_records(f"{root}/r.tfrecord", [example(id="a", label=1)])
    argv = [f"--input={root}", f"--output_dir={tmp_path / 'out'}", *FLAGS]
    with pytest.raises(UserError, match="--label_feature: .*'nope'.*its features: id, label"):
        convert.run([*argv, "--label_feature=nope"])
    with pytest.raises(UserError, match="--key_feature: the first record has no bytes"):
        convert.run([*argv, "--key_feature=label"])
    with pytest.raises(UserError, match="--group_by"):
        convert.run([*argv, "--group_by=missing"])


def test_a_named_feature_of_the_wrong_kind_says_its_kind(tmp_path):
    """A feature the first record holds, but not as the flag needs it: the line says what
    it is (it listed the feature among the record's, and no more)."""
    root = str(tmp_path / "in")
    many = np.array([1, 2, 3])
    write_records(f"{root}/r.tfrecord", [example(id="a", label=0.5, ids=many, none=np.array([]))])
    argv = [f"--input={root}", f"--output_dir={tmp_path / 'out'}", *FLAGS]
    for flag, said in (
        (
            "--label_feature=label",
            "no int64 or bytes feature 'label' of one value ('label' is a float list of 1 "
            "value); its features: id, ids, label, none",
        ),
        ("--group_by=ids", "'ids' is an int64 list of 3 values"),
        ("--key_feature=none", "'none' is a float list of 0 values"),
        ("--key_feature=nope", "no bytes feature 'nope' of one value; its features"),
    ):
        with pytest.raises(UserError) as e:
            convert.run([*argv, flag])
        assert said in str(e.value) and str(e.value).startswith(flag.split("=")[0]), str(e.value)


def test_dedupe_content_and_duplicate_keys_apply(tmp_path):
    root = str(tmp_path / "in")
    recs = mixed(6)
    again = example(id="ex-0", label="cat")  # another record under a key already used
    write_records(f"{root}/r.tfrecord", [*recs, recs[2], again])
    out = str(tmp_path / "out")
    flags = [*FLAGS, "--key_feature=id", "--dedupe=content", "--max_reject_fraction=0.5"]
    info = run_convert(root, out, *flags)
    rejects = sorted((r["key"], r["reason"]) for r in read_rejects(out))
    assert rejects == [("ex-0", "duplicate_key"), ("ex-2", "duplicate_key")]
    assert info["inputs"] == 8
    # under FILE#INDEX keys the copy of record 2 is a duplicate of its content
    out = str(tmp_path / "by_place")
    flags = [*FLAGS, "--dedupe=content", "--max_reject_fraction=0.5"]
    run_convert(root, out, *flags)
    [copy] = read_rejects(out)
    assert (copy["key"], copy["reason"]) == ("r.tfrecord#6", "duplicate_content")
    kept = collections.Counter(r for rs in shard_records(out).values() for r in rs)
    assert kept == collections.Counter([*recs, again])


@pytest.mark.fast
def test_the_writer_reads_a_record_again_and_names_one_that_changed(tmp_path):
    import zlib

    from beam_jobs.tfrecord_source import image_again
    from convert_core.records import Image
    from schemas import tfrecord
    from schemas.example import serialize_example

    path = str(tmp_path / "r.tfrecord")

    def write(ids):  # framed here: the unit lane imports no TensorFlow
        with open(path, "wb") as f:
            f.write(b"".join(tfrecord.frame(serialize_example({"id": i})) for i in ids))

    write(["a", "b", "c"])
    offset, data = list(tfrecord.records_at(path))[1]
    im = Image("k", "", "", "", None, None, "", 0, 0, 0, len(data), "", zlib.crc32(data))
    im = im._replace(record=(offset, len(data)))
    assert image_again(path, im, None) == (data, None)  # None: the whole record
    write(["a", "x", "c"])  # rewritten meanwhile, the same sizes
    assert "not the one inspected" in image_again(path, im, None)[1]


def test_a_group_feature_splits_image_records_too(tmp_path):
    from test_tfrecord_input import example as image_example
    from test_tfrecord_input import pngs

    root = str(tmp_path / "in")
    images = pngs(12)
    recs = [image_example(im, i % 2, person=f"p{i // 4}") for i, im in enumerate(images)]
    write_records(f"{root}/r.tfrecord", recs)
    out = str(tmp_path / "out")
    flags = ["--input_format=tfrecord", "--label_feature=label", "--group_by=person"]
    info = run_convert(root, out, *flags, "--splits=a=0.5,b=0.5", "--num_shards=1")
    assert info["inputs"] == 12 and info["split_options"]["group_by"] == "person"
    splits_of = collections.defaultdict(set)
    for split, rs in shard_records(out).items():
        for r in rs:  # the key FILE#INDEX names the record, so its person
            index = int(as_python(r)["image/key"][0].decode().split("#")[1])
            splits_of[index // 4].add(split)
    assert sorted(splits_of) == [0, 1, 2] and all(len(s) == 1 for s in splits_of.values())


def test_a_tfds_dataset_passes_through_with_its_class_names(tmp_path, tmp_path_factory):
    import glob

    import test_tfds_input as tfds_test

    src = tmp_path_factory.mktemp("src")
    for i, image in enumerate(tfds_test.pngs(18)):
        (src / f"{i}.png").write_bytes(image)
    data_dir = tmp_path_factory.mktemp("tfds")
    tfds_test.small_builder(src)(data_dir=str(data_dir)).download_and_prepare()
    prepared = str(data_dir / "small" / "1.0.0")
    out = str(tmp_path / "out")
    flags = ["--input_format=tfds", "--record_kind=example", "--label_feature=label"]
    info = run_convert(prepared, out, *flags, "--num_shards=2", "--input_split=train")
    assert info["inputs"] == 12 and info["labels"] == tfds_test.NAMES
    import tensorflow as tf

    shards = glob.glob(f"{prepared}/small-train.tfrecord-*")
    inputs = [r.numpy() for r in tf.data.TFRecordDataset(shards)]
    kept = collections.Counter(r for rs in shard_records(out).values() for r in rs)
    assert kept == collections.Counter(inputs)  # TFDS's own records, as they were


@pytest.mark.slow
def test_dask_gives_the_direct_runner_bytes(records, dask_runner_flags, tmp_path):
    root, _ = records
    flags = [*FLAGS, "--label_feature=label", "--balance=label"]
    runs = [
        run_convert(root, str(tmp_path / "direct"), *flags),
        run_convert(root, str(tmp_path / "dask"), *flags, *dask_runner_flags),
    ]
    shas = [
        [s["sha256"] for split in sorted(i["splits"]) for s in i["splits"][split]["shards"]]
        for i in runs
    ]
    assert shas[0] and shas[0] == shas[1]


@pytest.mark.fast
def test_a_group_value_is_text_or_an_int_and_a_record_without_one_is_its_own_group():
    from convert_core.record_rules import RecordFeatures, RecordProblem, RecordRules

    rules = RecordRules(RecordFeatures(None, None, "", None, "who"))
    assert rules.group({"who": ("bytes", [b"ann"])}) == "ann"
    assert rules.group({"who": ("int64", [7])}) == "7"
    assert rules.group({}) is None and rules.group({"who": ("bytes", [b""])}) is None
    assert rules.group({"who": ("bytes", [b"a", b"b"])}) is None
    with pytest.raises(RecordProblem) as e:
        rules.group({"who": ("bytes", [b"\xff"])})
    assert e.value.reason == "bad_split"
    assert rules.label({"label": ("bytes", [b"x"])}) == ""  # no label feature: no label
