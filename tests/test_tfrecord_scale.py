"""TFRecord inputs at scale (issue 42): the local mode counts records, not files, and the
writer reads a gzip file's records a shard needs in one pass of it."""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np
import pytest

from convert_core import paths
from convert_core.records import Image
from evenshard import synthetic
from schemas import storage, tfrecord
from schemas.example import serialize_example


def _images(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [synthetic.image_bytes("png", 16, 16, rng) for _ in range(n)]


def _write(path: str, images: list[bytes]) -> None:
    data = b"".join(
        tfrecord.frame(serialize_example({"image_raw": im, "label": i % 2}))
        for i, im in enumerate(images)
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(gzip.compress(data, mtime=0) if path.endswith(".gz") else data)


def _job(input: str, tmp_path):
    from convert_core.job import Job
    from convert_core.options import ConvertOptions

    return Job.of(
        ConvertOptions(input=input, output_dir=str(tmp_path / "o"), input_format="tfrecord")
    )


@pytest.mark.fast
@pytest.mark.parametrize("name", ["r.tfrecord", "r.tfrecord.gz"])
def test_records_are_counted_not_files(tmp_path, name):
    from beam_jobs.input_size import has_at_least

    images = _images(20)
    for f in ("a", "b"):
        _write(str(tmp_path / "in" / f / name), images)
    (tmp_path / "in" / "notes.txt").write_text("not an input\n" * 1000)
    for given in (str(tmp_path / "in"), str(tmp_path / "in" / "*" / "*.tfrecord*")):
        job = _job(given, tmp_path)
        # two files of 20 records: about 40 inputs, not 2
        assert has_at_least(job, 30) and not has_at_least(job, 60), given


@pytest.mark.fast
def test_one_record_files_count_one_each(tmp_path):
    from beam_jobs.input_size import has_at_least

    for i, image in enumerate(_images(3)):
        _write(str(tmp_path / "in" / f"{i}.tfrecord"), [image])
    (tmp_path / "in" / "other.txt").write_text("x")
    job = _job(str(tmp_path / "in"), tmp_path)
    assert has_at_least(job, 3) and not has_at_least(job, 4)


@pytest.mark.fast
def test_a_folder_of_many_files_counts_without_reading_one(tmp_path):
    from beam_jobs.input_size import has_at_least

    for i in range(8):  # no readable record: a read would count them small
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"{i}.tfrecord").write_bytes(b"no record")
    job = _job(str(tmp_path / "in"), tmp_path)
    assert has_at_least(job, 4) and not has_at_least(job, 5)


def _image(images: list[bytes], i: int, offset: int, length: int) -> Image:
    im = Image(f"k{i}", "", "", "0", None, None, "png", 16, 16, 3, len(images[i]), "", 0)
    return im._replace(crc32=zlib.crc32(images[i]), record=(offset, length))


@pytest.mark.fast
def test_a_shard_reads_each_gzip_file_once(tmp_path, monkeypatch):
    from beam_jobs.tfrecord_source import images_again

    images = _images(12)
    gz, plain = str(tmp_path / "a.tfrecord.gz"), str(tmp_path / "b.tfrecord")
    _write(gz, images[:8])
    _write(plain, images[8:])
    places = [list(tfrecord.records_at(p)) for p in (gz, plain)]
    items = [(gz, _image(images, i, o, len(d))) for i, (o, d) in enumerate(places[0])]
    items += [(plain, _image(images, 8 + i, o, len(d))) for i, (o, d) in enumerate(places[1])]
    order = np.random.default_rng(1).permutation(len(items))
    shard = [items[i] for i in order]
    opened = []
    open_binary = storage.open_binary
    monkeypatch.setattr(storage, "open_binary", lambda p: opened.append(p) or open_binary(p))
    got = list(images_again(shard, "image_raw"))
    assert got == [(images[i], None) for i in order]
    assert opened.count(gz) == 1


@pytest.mark.fast
def test_a_damaged_gzip_file_keeps_the_records_before_the_damage(tmp_path):
    from beam_jobs.tfrecord_source import images_again

    images = _images(4)
    gz = str(tmp_path / "a.tfrecord.gz")
    _write(gz, images)
    places = list(tfrecord.records_at(gz))
    items = [(gz, _image(images, i, o, len(d))) for i, (o, d) in enumerate(places)]
    data = gzip.decompress(open(gz, "rb").read())
    cut = places[2][0] + 20  # inside record 2
    with open(gz, "wb") as f:
        f.write(gzip.compress(data[:cut], mtime=0))
    got = list(images_again(items[::-1], "image_raw"))
    assert [problem is None for _, problem in got] == [False, False, True, True]
    assert all("not the one inspected" in problem for _, problem in got[:2])
    assert [image for image, _ in got[2:]] == [images[1], images[0]]
    os.remove(gz)
    assert all("removed" in problem for _, problem in images_again(items, "image_raw"))


@pytest.mark.fast
def test_a_local_folder_lists_what_beams_match_lists(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    from beam_jobs.record_formats import record_format
    from beam_jobs.record_source import record_files

    root = tmp_path / "in"
    for rel in ("a.tfrecord", "x/b.tfrecord", "x/y/c.tfrecord.gz", ".hidden/d.tfrecord", "e.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f.tfrecord").write_bytes(b"")
    os.symlink(root / "a.tfrecord", root / "x" / "link.tfrecord")  # a link to a file
    os.symlink(tmp_path / "elsewhere", root / "linked")  # a linked folder: not entered
    os.symlink(root / "gone.tfrecord", root / "broken.tfrecord")  # a broken link
    fmt, folder = record_format("tfrecord"), str(root)
    matched = sorted(m.path for m in FileSystems.match([folder + "/**"])[0].metadata_list)
    assert sorted(paths.local_files(folder)) == matched
    assert record_files(fmt, folder + "/**", folder, False) == matched
    named = ("a.tfrecord", "x/b.tfrecord", "x/link.tfrecord", "x/y/c.tfrecord.gz")
    assert record_files(fmt, folder + "/**", folder, True) == [f"{folder}/{n}" for n in named]
    assert len(record_files(fmt, folder + "/**", folder, False, limit=2)) == 2
