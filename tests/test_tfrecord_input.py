"""TFRecord files of tf.train.Example as convert's input (issue 42): written by
TensorFlow's own writer, converted, and read back with ``reader.make_dataset``."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
from conftest import assert_multi_process_gives_the_same_bytes, load_info, read_rejects, run_convert

from beam_jobs import convert
from convert_core.options import UserError
from evenshard import synthetic

FLAGS = ["--input_format=tfrecord", "--num_shards=2", "--max_reject_fraction=0.5"]


def example(image: bytes, label, label_name: str = "label", **extra) -> bytes:
    import tensorflow as tf

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        value = value.encode() if isinstance(value, str) else value
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    values = {"image_raw": image, label_name: label, **extra}
    features = {name: feature(v) for name, v in values.items()}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_records(path: str, records: list[bytes]) -> None:
    import tensorflow as tf

    os.makedirs(os.path.dirname(path), exist_ok=True)
    options = tf.io.TFRecordOptions("GZIP") if path.endswith(".gz") else None
    with tf.io.TFRecordWriter(path, options) as w:
        for r in records:
            w.write(r)


def pngs(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [synthetic.image_bytes("png", 8, 8, rng) for _ in range(n)]


def read_back(out: str) -> collections.Counter:
    """(key, label text) of every record of every split, read with reader.make_dataset."""
    import reader

    seen = collections.Counter()
    for split, counts in load_info(out)["splits"].items():
        if not counts["num_examples"]:
            continue
        ds = reader.make_dataset(out, split, batch_size=4, shuffle=False, decode=False)
        for batch in ds:
            keys = [k.decode() for k in batch["key"].numpy()]
            seen.update(zip(keys, batch["label"].numpy().tolist()))
    return seen


@pytest.fixture(scope="module")
def one_a_file(tmp_path_factory):
    """12 one-example files, label-sorted (the first six label 0, then label 1)."""
    root = str(tmp_path_factory.mktemp("one") / "records")
    for i, image in enumerate(pngs(12)):
        write_records(f"{root}/train-{i:05d}.tfrecord", [example(image, i // 6)])
    return root


def test_one_example_files_convert_and_read_back_once(one_a_file, tmp_path):
    out = str(tmp_path / "out")
    info = run_convert(one_a_file, out, *FLAGS)
    assert info["inputs"] == 12 and info["rejects"]["total"] == 0
    assert info["labels"] == ["0", "1"]
    expected = {(f"train-{i:05d}.tfrecord#0", i // 6): 1 for i in range(12)}
    assert read_back(out) == expected


def test_multi_example_files_and_gzip_keep_every_record_once(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(30)
    for f in range(3):  # label-sorted: file f holds label f only
        suffix = ".tfrecord.gz" if f == 2 else ".tfrecord"
        recs = [example(images[f * 10 + i], f) for i in range(10)]
        write_records(f"{root}/sub/part-{f}{suffix}", recs)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert info["inputs"] == 30 and info["labels"] == ["0", "1", "2"]
    names = {0: "part-0.tfrecord", 1: "part-1.tfrecord", 2: "part-2.tfrecord.gz"}
    expected = {(f"sub/{names[f]}#{i}", f): 1 for f in range(3) for i in range(10)}
    assert read_back(out) == expected
    # mixed: each shard holds every label
    for split in info["splits"].values():
        for shard in split["shards"]:
            if shard["num_examples"] >= 6:
                assert len(shard["label_counts"]) >= 2


def test_damaged_files_give_named_rejects_and_counts_reconcile(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(12)
    write_records(f"{root}/good.tfrecord", [example(im, 0) for im in images[:4]])
    write_records(f"{root}/cut.tfrecord", [example(im, 1) for im in images[4:8]])
    with open(f"{root}/cut.tfrecord", "r+b") as f:  # cut inside record 2
        size = os.path.getsize(f"{root}/cut.tfrecord")
        f.truncate(size - size // 4 - 10)
    write_records(f"{root}/crc.tfrecord", [example(im, 1) for im in images[8:11]])
    with open(f"{root}/crc.tfrecord", "r+b") as f:  # a flipped byte in record 1's data
        data = bytearray(f.read())
        one = len(data) // 3
        data[one + 40] ^= 0xFF
        f.seek(0)
        f.write(data)
    with open(f"{root}/text.tfrecord", "w") as f:
        f.write("not records at all, but long enough to hold a header\n")
    write_records(f"{root}/notimage.tfrecord", [example(b"GIF89a but not", 0)])
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {
        ("cut.tfrecord#2", "truncated"),
        ("crc.tfrecord#1", "corrupt"),
        ("text.tfrecord#0", "corrupt"),
        ("notimage.tfrecord#0", "corrupt"),
    }
    details = {r["key"]: r["detail"] for r in read_rejects(out)}
    assert "byte" in details["cut.tfrecord#2"]
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert written == 4 + 2 + 2  # the records before and after the damage are kept
    assert info["inputs"] == written + info["rejects"]["total"] == 12
    assert set(read_back(out)) == {
        *((f"good.tfrecord#{i}", 0) for i in range(4)),
        *((f"cut.tfrecord#{i}", 1) for i in range(2)),
        ("crc.tfrecord#0", 1),
        ("crc.tfrecord#2", 1),
    }


@pytest.mark.parametrize("fix_crc", [False, True], ids=["length-crc-wrong", "length-crc-holds"])
def test_a_damaged_length_in_the_middle_loses_only_its_record(tmp_path, fix_crc):
    """The 5th of ten records' length field made huge: the five records after it are
    read past it (found by their CRCs), counted as inputs and written; the damage is
    one reject naming its bytes. How many records the damaged stretch held cannot be
    known (its length is what was damaged), so the records after it are keyed by their
    byte, never by an index that could name another record."""
    import struct

    from schemas import tfrecord

    root = str(tmp_path / "in")
    path = f"{root}/ten.tfrecord"
    write_records(path, [example(im, i % 2) for i, im in enumerate(pngs(10))])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    starts = [offset for offset, _ in tfrecord.records_at(path)]
    length = struct.pack("<Q", 1 << 40)
    data[starts[4] : starts[4] + 8] = length
    if fix_crc:
        data[starts[4] + 8 : starts[4] + 12] = struct.pack("<I", tfrecord.masked_crc(length))
    with open(path, "wb") as f:
        f.write(data)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    [reject] = read_rejects(out)
    assert (reject["key"], reject["reason"]) == ("ten.tfrecord#4", "corrupt")
    assert f"bytes {starts[4]} to {starts[5] - 1}" in reject["detail"]
    assert info["inputs"] == 10 and info["rejects"]["total"] == 1
    assert set(read_back(out)) == {
        *((f"ten.tfrecord#{i}", i % 2) for i in range(4)),
        *((f"ten.tfrecord@{starts[i]}", i % 2) for i in range(5, 10)),
    }


def test_in_memory_and_multi_process_give_the_same_bytes(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(24)
    for f in range(4):
        write_records(
            f"{root}/p{f}.tfrecord", [example(images[f * 6 + i], f % 2) for i in range(6)]
        )
    assert_multi_process_gives_the_same_bytes(root, tmp_path, *FLAGS, "--balance=label")


def test_features_by_flag_string_labels_and_keys_and_a_glob(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(8)
    recs = [
        example(im, "cat" if i < 4 else "dog", jpeg_too=images[0], id=f"img-{i}", height=8)
        for i, im in enumerate(images)
    ]
    write_records(f"{root}/a.tfrecord", recs[:5])
    write_records(f"{root}/b.tfrecord", recs[5:])
    write_records(f"{root}/skip.other", recs[:1])
    out = str(tmp_path / "out")
    flags = [*FLAGS, "--image_feature=image_raw", "--label_feature=label", "--key_feature=id"]
    info = run_convert(f"{root}/*.tfrecord", out, *flags)
    assert info["inputs"] == 8 and info["labels"] == ["cat", "dog"]
    assert set(read_back(out)) == {(f"img-{i}", 0 if i < 4 else 1) for i in range(8)}


def test_ambiguous_features_are_one_line_naming_the_flag(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(2)
    write_records(f"{root}/a.tfrecord", [example(images[0], 0, "cls", other=images[1], size=3)])
    argv = [f"--input={root}", f"--output_dir={tmp_path / 'out'}", "--input_format=tfrecord"]
    with pytest.raises(UserError) as e:
        convert.run(argv)
    message = str(e.value)
    assert "\n" not in message
    assert "--image_feature" in message and "image_raw" in message and "other" in message
    with pytest.raises(UserError) as e:
        convert.run([*argv, "--image_feature=image_raw"])
    assert "--label_feature" in str(e.value) and "cls, size" in str(e.value)
    with pytest.raises(UserError) as e:
        convert.run([*argv, "--image_feature=nope"])
    assert "nope" in str(e.value) and "image_raw" in str(e.value)
    assert not os.path.exists(tmp_path / "out" / "dataset_info.json")


@pytest.mark.fast
def test_record_flags_need_the_tfrecord_format():
    with pytest.raises(UserError, match="--input_format=tfrecord"):
        convert.run(["--input=x", "--output_dir=y", "--image_feature=img"])
    with pytest.raises(UserError, match="--record_kind"):
        convert.run(
            ["--input=x", "--output_dir=y", "--input_format=tfrecord", "--record_kind=path"]
        )


def test_int_labels_are_their_own_ids_and_duplicate_keys_are_rejects(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(6)
    labels = [0, 0, 2, 2, 5, 0]  # no 1, 3 or 4: ids still equal the ints
    keys = ["a", "b", "c", "d", "e", "a"]  # the last repeats the first
    recs = [example(im, y, id=k) for im, y, k in zip(images, labels, keys)]
    write_records(f"{root}/r.tfrecord", recs)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS, "--key_feature=id")
    assert info["labels"] == ["0", "1", "2", "3", "4", "5"]
    assert read_back(out) == {("a", 0): 1, ("b", 0): 1, ("c", 2): 1, ("d", 2): 1, ("e", 5): 1}
    [dup] = read_rejects(out)
    assert (dup["key"], dup["reason"]) == ("a", "duplicate_key")
    assert info["inputs"] == 6
    # with --labels, an int label is a line of the file; one past its end is a reject
    vocab = tmp_path / "labels.txt"
    vocab.write_text("zero\none\ntwo\n")
    out = str(tmp_path / "named")
    info = run_convert(root, out, *FLAGS, "--key_feature=id", f"--labels={vocab}")
    assert info["labels"] == ["zero", "one", "two"]
    assert {(r["key"], r["reason"]) for r in read_rejects(out)} == {
        ("a", "duplicate_key"),
        ("e", "bad_label"),
    }
    assert set(read_back(out)) == {("a", 0), ("b", 0), ("c", 2), ("d", 2)}


def test_a_folder_of_records_without_the_flag_is_one_line_naming_it(one_a_file, tmp_path):
    argv = [f"--input={one_a_file}", f"--output_dir={tmp_path / 'out'}"]
    with pytest.raises(UserError, match="--input_format=tfrecord"):
        convert.run(argv)
    flags = [*argv[1:], "--input_format=tfrecord"]
    with pytest.raises(UserError, match="no files match"):
        convert.run([f"--input={tmp_path}/*.nothing", *flags])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.png").write_bytes(pngs(1)[0])
    with pytest.raises(UserError, match="no TFRecord files"):
        convert.run([f"--input={tmp_path / 'other'}", *flags])
    (tmp_path / "other" / "a.tfrecord").write_text("no records here, only text")
    with pytest.raises(UserError, match="a.tfrecord: record 0"):
        convert.run([f"--input={tmp_path / 'other'}", *flags])


@pytest.mark.slow
def test_records_in_a_bucket(bucket, tmp_path):
    """A folder of records in gs:// or s3:// (one gzip file), read through Beam's file
    systems; the shard writer reads each record again by its range."""
    local = str(tmp_path / "in")
    images = pngs(9)
    write_records(f"{local}/a.tfrecord", [example(im, 0) for im in images[:4]])
    write_records(f"{local}/b.tfrecord.gz", [example(im, 1) for im in images[4:]])
    url = bucket.upload(local, "records")
    out = str(tmp_path / "out")
    info = run_convert(url, out, *FLAGS)
    assert info["inputs"] == 9 and info["rejects"]["total"] == 0
    expected = {(f"a.tfrecord#{i}", 0) for i in range(4)}
    expected |= {(f"b.tfrecord.gz#{i}", 1) for i in range(5)}
    assert set(read_back(out)) == expected


def test_a_bucket_record_is_one_request_not_two(one_a_file, tmp_path):
    """A bucket's small records carry their image from inspection to the shard writer:
    each one-example file is downloaded once (the driver reads one file's first record
    more, to choose the features), not again by the writer."""
    from evenshard.emulator import gcs_emulator, upload

    log = tmp_path / "downloads.log"
    with gcs_emulator(log=str(log)) as client:
        url = upload(client.create_bucket("once"), one_a_file, "records")
        out = str(tmp_path / "out")
        info = run_convert(url, out, *FLAGS)
    assert info["inputs"] == 12 and info["rejects"]["total"] == 0
    downloads = collections.Counter(line.split("\t")[0] for line in log.read_text().splitlines())
    assert set(downloads) == {f"records/train-{i:05d}.tfrecord" for i in range(12)}
    assert sorted(downloads.values()) == [1] * 11 + [2]
    assert read_back(out) == {(f"train-{i:05d}.tfrecord#0", i // 6): 1 for i in range(12)}


@pytest.mark.fast
@pytest.mark.parametrize("name", ["r.tfrecord", "r.tfrecord.gz"])
def test_the_writer_reads_a_record_again_and_names_one_that_changed(tmp_path, name):
    import gzip
    import zlib

    from beam_jobs.tfrecord_source import image_again
    from convert_core.records import Image
    from schemas import tfrecord
    from schemas.example import serialize_example

    def write(images):  # framed here: the unit lane imports no TensorFlow
        data = b"".join(tfrecord.frame(serialize_example({"image_raw": i})) for i in images)
        with open(path, "wb") as f:
            f.write(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)

    images = pngs(3)
    path = str(tmp_path / name)
    write(images)
    offset, data = list(tfrecord.records_at(path))[1]
    im = Image("k", "", "", "0", None, None, "png", 8, 8, 3, len(images[1]), "", 0)
    im = im._replace(crc32=zlib.crc32(images[1]), record=(offset, len(data)))
    assert image_again(path, im, "image_raw") == (images[1], None)
    assert "'other'" in image_again(path, im, "other")[1]
    write(images[::-1])  # rewritten meanwhile
    assert "not the one inspected" in image_again(path, im, "image_raw")[1]
    os.remove(path)
    assert "removed" in image_again(path, im, "image_raw")[1]


@pytest.mark.fast
def test_features_are_found_in_tfds_and_evenshard_records():
    from convert_core.record_rules import choose_features

    png = pngs(1)[0]
    tfds = {
        "image/encoded": ("bytes", [png]),
        "image/format": ("bytes", [b"png"]),
        "image/filename": ("bytes", [b"n01440764_10026.JPEG"]),
        "image/class/label": ("int64", [3]),
        "image/class/text": ("bytes", [b"tench"]),
        "image/height": ("int64", [8]),
    }
    f = choose_features(tfds, None, None, None)
    assert (f.image, f.label, f.label_kind, f.key) == (
        "image/encoded",
        "image/class/label",
        "int64",
        None,
    )
    ours = {**tfds, "image/key": ("bytes", [b"a/b.png"])}
    assert choose_features(ours, None, None, None).key == "image/key"
    assert choose_features(tfds, None, "image/class/text", None).label_kind == "bytes"
    with pytest.raises(UserError, match="--label_feature"):
        choose_features(
            {"img": ("bytes", [png]), "a": ("int64", [1]), "b": ("int64", [2])}, None, None, None
        )
    with pytest.raises(UserError, match="--image_feature: no feature"):
        choose_features({"a": ("int64", [1])}, None, None, None)


def test_an_int_label_past_the_largest_id_is_a_reject_not_a_vocabulary_of_it(tmp_path):
    """An int label is its own id, so labels.txt lists 0 to the largest: a hashed or
    huge int (2**62) would be a list of that many names, memory the run never has.
    Past ``record_rules.MAX_LABEL_ID`` it is a ``bad_label`` naming --labels."""
    from convert_core.record_rules import MAX_LABEL_ID

    root = str(tmp_path / "in")
    labels = [0, 1, MAX_LABEL_ID + 1, 1]
    write_records(f"{root}/r.tfrecord", [example(im, y) for im, y in zip(pngs(4), labels)])
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert info["labels"] == ["0", "1"]
    [r] = read_rejects(out)
    assert (r["key"], r["reason"]) == ("r.tfrecord#2", "bad_label")
    assert "--labels" in r["detail"] and str(MAX_LABEL_ID + 1) in r["detail"]
    assert info["inputs"] == 4 == sum(s["num_examples"] for s in info["splits"].values()) + 1
    # with --labels the int is a line of the file: its end is the bound
    vocab = tmp_path / "labels.txt"
    vocab.write_text("a\nb\n")
    info = run_convert(root, str(tmp_path / "named"), *FLAGS, f"--labels={vocab}")
    assert info["labels"] == ["a", "b"] and info["rejects"]["total"] == 1


def test_a_gzip_file_cut_where_a_record_ends_is_truncated_not_shorter(tmp_path):
    """A .tfrecord.gz cut where its decompressed bytes end on a record boundary (each
    record flushed, the copy cut after record 1's flush) has no gzip trailer: one
    ``truncated`` reject at record 2 (was: read as a file of two records, the rest
    gone with no reject). A zero-byte .gz still holds no records."""
    import zlib

    from schemas import tfrecord

    root = str(tmp_path / "in")
    os.makedirs(root)
    z = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    parts = [z.compress(tfrecord.frame(example(im, 0))) + z.flush(zlib.Z_FULL_FLUSH)
             for im in pngs(4)]  # fmt: skip
    with open(f"{root}/cut.tfrecord.gz", "wb") as f:
        f.write(b"".join(parts[:2]))  # no further records, no trailer
    open(f"{root}/zero.tfrecord.gz", "wb").close()
    write_records(f"{root}/whole.tfrecord.gz", [example(im, 1) for im in pngs(2, seed=1)])
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert [(r["key"], r["reason"]) for r in read_rejects(out)] == [
        ("cut.tfrecord.gz#2", "truncated")
    ]
    assert set(read_back(out)) == {
        *((f"cut.tfrecord.gz#{i}", 0) for i in range(2)),
        *((f"whole.tfrecord.gz#{i}", 1) for i in range(2)),
    }
    assert info["inputs"] == 5


def test_gzip_records_in_a_file_not_named_gz_say_so(tmp_path):
    """TFRecordWriter's GZIP option writes any name: a gzip file named .tfrecord was
    'length checksum mismatch', no hint; now the one line says to name it .gz."""
    root = str(tmp_path / "in")
    write_records(f"{root}/a.tfrecord.gz", [example(im, 0) for im in pngs(2)])
    os.rename(f"{root}/a.tfrecord.gz", f"{root}/a.tfrecord")
    argv = [f"--input={root}", f"--output_dir={tmp_path / 'o'}", "--input_format=tfrecord"]
    with pytest.raises(UserError, match=r"gzip.*\.gz") as e:
        convert.run(argv)
    assert "\n" not in str(e.value)
