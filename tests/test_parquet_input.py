"""Parquet files as Hugging Face ``datasets`` writes image datasets, as convert's input
(issue 42): written by ``datasets`` itself, converted, and read back with
``reader.make_dataset``."""

from __future__ import annotations

import os

import pytest
from conftest import (
    assert_multi_process_gives_the_same_bytes,
    read_rejects,
    read_split,
    run_convert,
)
from test_tfrecord_input import pngs, read_back

from beam_jobs import convert
from convert_core.options import UserError

FLAGS = ["--input_format=parquet", "--num_shards=2", "--max_reject_fraction=0.5"]
NAMES = ["cat", "dog", "owl"]


def write_parquet(
    path: str, images: list[bytes], labels: list[int], batch_size=None, **columns
) -> None:
    """A Parquet file as ``datasets`` writes one: an Image column, a ClassLabel column
    (``batch_size``: rows a row group)."""
    from datasets import ClassLabel, Dataset, Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    rows = [{"bytes": b, "path": f"img{i}.png"} for i, b in enumerate(images)]
    ds = Dataset.from_dict({"image": rows, "label": labels, **columns})
    ds = ds.cast_column("image", Image()).cast_column("label", ClassLabel(names=NAMES))
    ds.to_parquet(path, batch_size=batch_size)


def test_files_written_by_datasets_convert_and_read_back_once(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(20)
    # label-sorted, as a dataset's shards often are
    write_parquet(f"{root}/data/train-0.parquet", images[:10], [0] * 10)
    write_parquet(f"{root}/data/train-1.parquet", images[10:], [1] * 5 + [2] * 5)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert info["inputs"] == 20 and info["rejects"]["total"] == 0
    assert info["labels"] == NAMES  # the ClassLabel names of the file's metadata
    expected = {(f"data/train-0.parquet#{i}", 0): 1 for i in range(10)}
    expected |= {(f"data/train-1.parquet#{i}", 1 + i // 5): 1 for i in range(10)}
    assert read_back(out) == expected


def test_damaged_files_give_named_rejects_and_counts_reconcile(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(9)
    write_parquet(f"{root}/good.parquet", images[:4], [0] * 4)
    write_parquet(f"{root}/cut.parquet", images[4:8], [1] * 4)
    with open(f"{root}/cut.parquet", "r+b") as f:  # its footer cut off
        f.truncate(os.path.getsize(f"{root}/cut.parquet") // 2)
    with open(f"{root}/text.parquet", "w") as f:
        f.write("not parquet at all, but long enough to hold a header\n")
    write_parquet(f"{root}/notimage.parquet", [b"GIF89a but not"], [2])
    write_parquet(f"{root}/partly.parquet", images[:6], [2] * 6, batch_size=2)
    import pyarrow.parquet as pq

    column = pq.ParquetFile(f"{root}/partly.parquet").metadata.row_group(1).column(0)
    with open(f"{root}/partly.parquet", "r+b") as f:  # row group 1's page header
        f.seek(column.data_page_offset)
        f.write(b"\xff" * 8)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {
        ("cut.parquet#0", "corrupt"),
        ("text.parquet#0", "corrupt"),
        ("notimage.parquet#0", "corrupt"),
        ("partly.parquet#2", "corrupt"),
    }
    details = {r["key"]: r["detail"] for r in read_rejects(out)}
    assert "row 0" in details["cut.parquet#0"]
    assert "row group 1 (2 rows)" in details["partly.parquet#2"]
    assert all("\n" not in d for d in details.values())
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert written == 4 + 4  # the row groups around the damaged one are kept
    assert info["inputs"] == written + info["rejects"]["total"] == 12
    assert set(read_back(out)) == {
        *((f"good.parquet#{i}", 0) for i in range(4)),
        *((f"partly.parquet#{i}", 2) for i in (0, 1, 4, 5)),
    }


def test_in_memory_and_multi_process_give_the_same_bytes(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(24)
    for f in range(3):
        write_parquet(f"{root}/p{f}.parquet", images[f * 8 : f * 8 + 8], [f % 2] * 8)
    assert_multi_process_gives_the_same_bytes(root, tmp_path, *FLAGS, "--balance=label")


def test_columns_by_flag_and_ambiguity_is_one_line(tmp_path):
    root = str(tmp_path / "in")
    images = pngs(4)
    ids = [f"img-{i}" for i in range(4)]
    write_parquet(f"{root}/a.parquet", images, [0, 0, 1, 1], id=ids, tag=["x"] * 4)
    out = str(tmp_path / "out")
    flags = [*FLAGS, "--label_feature=label", "--key_feature=id"]
    info = run_convert(f"{root}/*.parquet", out, *flags)
    assert info["inputs"] == 4
    assert set(read_back(out)) == {("img-0", 0), ("img-1", 0), ("img-2", 1), ("img-3", 1)}
    # no column named *label*: label, id and tag could each be it
    write_parquet(f"{tmp_path}/b/b.parquet", images, [0] * 4, id=ids, tag=["x"] * 4)
    import pyarrow.parquet as pq

    table = pq.read_table(f"{tmp_path}/b/b.parquet").rename_columns(["image", "y", "id", "tag"])
    pq.write_table(table.replace_schema_metadata(None), f"{tmp_path}/b/b.parquet")
    argv = [f"--input={tmp_path}/b", f"--output_dir={tmp_path / 'o2'}", "--input_format=parquet"]
    with pytest.raises(UserError) as e:
        convert.run(argv)
    assert "\n" not in str(e.value)
    assert "--label_feature" in str(e.value) and "id, tag, y" in str(e.value)


@pytest.mark.fast
def test_a_folder_without_parquet_files_is_one_line(tmp_path):
    (tmp_path / "a.png").write_bytes(pngs(1)[0])
    argv = [f"--input={tmp_path}", f"--output_dir={tmp_path / 'out'}", "--input_format=parquet"]
    with pytest.raises(UserError, match=r"no Parquet files \(named \*\.parquet\)"):
        convert.run(argv)


@pytest.mark.fast
def test_the_writer_reads_the_rows_copied_as_they_were_read(tmp_path):
    """Each row's image is copied once as it is read (a file in .incomplete/, a range a
    row): the writer reads a shard's images from there, a ranged read each, never the
    Parquet file again (a row group cannot be read a row at a time)."""
    from beam_jobs.parquet_source import FORMAT, images_again
    from convert_core.inspection import Inspector
    from convert_core.record_rules import RecordFeatures, RecordRules

    root, scratch = str(tmp_path / "in"), str(tmp_path / "out" / ".incomplete")
    images = pngs(3)
    write_parquet(f"{root}/a.parquet", images, [0, 1, 2], batch_size=2)  # groups of 2 and 1
    rules = RecordRules(RecordFeatures("image", "label", "int64"), tuple(NAMES))
    inspect = (Inspector("full", 10**8, root, 256 * 10**6), None)
    reader = FORMAT.reader(root, rules, inspect, scratch)
    reader.setup()
    read = list(reader.process(f"{root}/a.parquet"))
    assert [im.key for im in read] == [f"a.parquet#{i}" for i in range(3)]
    os.remove(f"{root}/a.parquet")  # the writer needs it no more
    shard = [(f"{root}/a.parquet", read[i]) for i in (2, 0, 1)]  # a shard's order
    assert list(images_again(shard, "image", scratch)) == [(images[i], None) for i in (2, 0, 1)]
    [copy] = os.listdir(scratch)
    with open(os.path.join(scratch, copy), "r+b") as f:  # the copy damaged
        f.seek(read[1].record[1] + 20)  # record: (row, byte offset, length)
        f.write(b"\xff\xff")
    [(_, problem)] = images_again([shard[2]], "image", scratch)
    assert problem and "not the one inspected" in problem
    os.remove(os.path.join(scratch, copy))
    [(_, problem)] = images_again([shard[0]], "image", scratch)
    assert problem and "removed" in problem


@pytest.mark.slow
def test_dask_gives_the_direct_runner_bytes_and_rejects(dask_runner_flags, tmp_path):
    root = str(tmp_path / "in")
    images = pngs(30)
    for f in range(3):
        write_parquet(f"{root}/p{f}.parquet", images[f * 10 : f * 10 + 10], [f] * 10)
    with open(f"{root}/text.parquet", "w") as f:
        f.write("not parquet")
    direct = run_convert(root, str(tmp_path / "direct"), *FLAGS)
    dask = run_convert(root, str(tmp_path / "dask"), *FLAGS, *dask_runner_flags)
    assert direct["inputs"] == dask["inputs"] == 31
    assert dask["rejects"] == direct["rejects"] and direct["rejects"]["total"] == 1
    shas = [
        [s["sha256"] for sp in sorted(i["splits"]) for s in i["splits"][sp]["shards"]]
        for i in (direct, dask)
    ]
    assert shas[0] == shas[1]


@pytest.mark.slow
def test_parquet_in_a_bucket(bucket, tmp_path):
    """Parquet files in gs:// or s3://, read through Beam's file systems, converted to a
    local folder and to one in the bucket (the images copied there as they are read)."""
    local = str(tmp_path / "in")
    images = pngs(9)
    write_parquet(f"{local}/a.parquet", images[:4], [0] * 4)
    write_parquet(f"{local}/b.parquet", images[4:], [1] * 5, batch_size=2)
    url = bucket.upload(local, "parquet")
    out = str(tmp_path / "out")
    info = run_convert(url, out, *FLAGS)
    assert info["inputs"] == 9 and info["rejects"]["total"] == 0
    expected = {(f"a.parquet#{i}", 0) for i in range(4)}
    expected |= {(f"b.parquet#{i}", 1) for i in range(5)}
    assert set(read_back(out)) == expected
    # into the bucket too: the images copied there (its .incomplete/), the same bytes
    there = run_convert(url, f"{bucket.url}/out", *FLAGS)
    assert [
        s["sha256"] for sp in sorted(there["splits"]) for s in there["splits"][sp]["shards"]
    ] == [s["sha256"] for sp in sorted(info["splits"]) for s in info["splits"][sp]["shards"]]


def write_path_parquet(root, outside) -> list[str]:
    """``Dataset.to_parquet`` of a dataset made from file paths (``{bytes: None, path}``
    rows) in ``root/hf/``, the images in ``root/photos/``: two absolute paths, two
    relative to the Parquet file, then a missing file, an absolute path outside ``root``
    and a relative one leaving it (``outside``, a file beside ``root``)."""
    from datasets import ClassLabel, Dataset, Image

    os.makedirs(f"{root}/photos")
    for i, data in enumerate(pngs(4)):
        with open(f"{root}/photos/{i}.png", "wb") as f:
            f.write(data)
    with open(outside, "wb") as f:
        f.write(pngs(1, seed=1)[0])
    named = [f"{root}/photos/0.png", f"{root}/photos/1.png", "../photos/2.png", "../photos/3.png"]
    named += [f"{root}/photos/gone.png", outside, f"../../{os.path.basename(outside)}"]
    ds = Dataset.from_dict({"image": named, "label": [0, 1, 2, 0, 1, 2, 0]})
    ds = ds.cast_column("image", Image()).cast_column("label", ClassLabel(names=NAMES))
    # batch_size given: no size estimate, which would look for the relative paths'
    # files in the working folder
    ds.to_parquet(f"{root}/hf/train.parquet", batch_size=10)
    import pyarrow.parquet as pq

    assert pq.read_table(f"{root}/hf/train.parquet")["image"][0].as_py()["bytes"] is None
    return named


def test_images_stored_as_paths_are_read_from_their_files(tmp_path):
    """A Parquet file whose image structs hold paths only: each image is read from its
    file (absolute, or relative to the Parquet file), never from outside the input
    folder; a missing file or a path outside is a reject naming it (was: "none of the
    first 1 Parquet files ... holds a readable row"). The writer takes each from the
    run's copy, as an embedded image."""
    root = str(tmp_path / "in")
    named = write_path_parquet(root, str(tmp_path / "outside.png"))
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert set(read_back(out)) == {(f"hf/train.parquet#{i}", [0, 1, 2, 0][i]) for i in range(4)}
    written = {
        r["image/key"].decode(): r["image/encoded"]
        for split in info["splits"]
        for shard in read_split(out, split)
        for r in shard
    }
    assert written == {f"hf/train.parquet#{i}": pngs(4)[i] for i in range(4)}  # the files'
    details = {(r["key"], r["reason"]): r["detail"] for r in read_rejects(out)}
    assert sorted(details) == [
        ("hf/train.parquet#4", "missing"),
        ("hf/train.parquet#5", "bad_path"),
        ("hf/train.parquet#6", "bad_path"),
    ]
    assert named[4] in details["hf/train.parquet#4", "missing"]
    for row in (5, 6):
        detail = details[f"hf/train.parquet#{row}", "bad_path"]
        assert repr(named[row]) in detail and f"outside the input folder {root}" in detail
    assert info["inputs"] == 7 == 4 + info["rejects"]["total"]


@pytest.mark.slow
def test_images_stored_as_paths_in_a_bucket_stay_in_its_folder(bucket, tmp_path):
    """In a bucket, a relative path is read from the bucket; an absolute one is a local
    path, outside the bucket's folder: a reject, never a read of this machine's file."""
    local = str(tmp_path / "in")
    write_path_parquet(local, str(tmp_path / "outside.png"))
    url = bucket.upload(local, "in")
    out = str(tmp_path / "out")
    info = run_convert(url, out, *FLAGS, "--max_reject_fraction=0.9")
    assert set(read_back(out)) == {("hf/train.parquet#2", 2), ("hf/train.parquet#3", 0)}
    reasons = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert reasons == {f"hf/train.parquet#{i}": "bad_path" for i in (0, 1, 4, 5, 6)}
    assert info["inputs"] == 7


def test_an_unlabelled_row_names_the_class_names_it_is_outside_of(tmp_path):
    """datasets writes -1 for a row with no label: a bad_label saying the ids its
    ClassLabel names allow (was: '3 in --labels', a flag the run was not given)."""
    from datasets import ClassLabel, Dataset, Image

    root = str(tmp_path / "in")
    os.makedirs(root)
    rows = [{"bytes": b, "path": f"img{i}.png"} for i, b in enumerate(pngs(3))]
    ds = Dataset.from_dict({"image": rows, "label": [0, -1, 2]})
    ds = ds.cast_column("image", Image()).cast_column("label", ClassLabel(names=NAMES))
    ds.to_parquet(f"{root}/t.parquet")
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    [r] = read_rejects(out)
    assert (r["key"], r["reason"]) == ("t.parquet#1", "bad_label")
    assert "--labels" not in r["detail"] and "class names" in r["detail"], r["detail"]
    assert info["inputs"] == 3 and info["labels"] == NAMES


def test_a_row_with_an_empty_image_first_keeps_the_copy_of_the_rows_after_it(tmp_path):
    """A row whose image is empty (no bytes) first in a file: the rows after it are still
    read again from the file's one copy (the empty image is its own reject)."""
    from beam_jobs.parquet_source import FORMAT, images_again
    from convert_core.inspection import Inspector
    from convert_core.record_rules import RecordFeatures, RecordRules
    from convert_core.records import Image

    root, scratch = str(tmp_path / "in"), str(tmp_path / "out" / ".incomplete")
    images = pngs(2)
    write_parquet(f"{root}/a.parquet", [b"", *images], [0, 1, 2])
    rules = RecordRules(RecordFeatures("image", "label", "int64"), tuple(NAMES))
    inspect = (Inspector("full", 10**8, root, 256 * 10**6), None)
    reader = FORMAT.reader(root, rules, inspect, scratch)
    reader.setup()
    read = [r for r in reader.process(f"{root}/a.parquet") if isinstance(r, Image)]
    assert [im.key for im in read] == ["a.parquet#1", "a.parquet#2"]
    shard = [(f"{root}/a.parquet", im) for im in read]
    assert list(images_again(shard, "image", scratch)) == [(im, None) for im in images]
