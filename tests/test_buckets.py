"""Datasets in a bucket, gs:// and s3://, against API servers on loopback (issue 20).
Convert writes there (locked), the one IO layer (schemas/storage.py) reads there for
inspect, validate and shuffle-report, the readers stream shards through the bounded
cache, and what is wrong is one line.

What differs between the stores runs on each store (``bucket``: gs and s3): the IO
layer's calls (schemas/stores.py: reads, listings, missing buckets and objects, the
conditional writes of convert's lock), convert's reads and writes through Beam's GCS
and S3 file systems, and the command that serves a folder. The readers' and the
cache's logic sits above that layer (storage.read_range, download, size, exists: the
same code whichever store answers), so each of those tests runs on one store
(``on("gs")``, ``on("s3")``), alternating, so that each store still serves ranged
reads, whole downloads, errors and converts of the readers' tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Bucket, run_convert
from dataset_writer import write_dataset

from audit.validate import validate
from convert_core.options import UserError
from evenshard import cli, synthetic
from schemas import layout, storage
from schemas.info import DatasetError, load_info

pytestmark = pytest.mark.slow


def on(store: str):
    """One store for a test of logic above the IO layer (the module's docstring)."""
    return pytest.mark.parametrize("bucket", [store], indirect=True)


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("gcs") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=20, formats=("jpeg", "png"))
    out = str(tmp_path_factory.mktemp("gcs_out") / "out")
    write_dataset(str(root), out, "--splits=train=0.8,val=0.2", "--num_shards=6")
    return out


def test_inspect_and_validate_read_a_dataset_in_a_bucket(bucket, local_dataset, capsys):
    url = bucket.upload(local_dataset, "data/out")
    assert load_info(url) == load_info(local_dataset)
    assert storage.isdir(url) and storage.listdir(url) == sorted(
        n for n in storage.listdir(local_dataset)
    )
    assert validate(url, full=True) == []
    assert cli.main(["inspect", url]) == 0
    assert "train" in capsys.readouterr().out
    # a shard changed in the bucket is named
    shard = load_info(url)["splits"]["train"]["shards"][0]["file"]
    data = bytearray(bucket.get(f"data/out/{shard}"))
    data[-10] ^= 0xFF
    bucket.put(f"data/out/{shard}", bytes(data))
    assert any(shard in p for p in validate(url))


def test_a_missing_bucket_or_object_is_one_line_naming_it(bucket, capsys):
    missing = f"{bucket.scheme}://no-such-bucket-here"
    assert cli.main(["inspect", f"{missing}/out"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{missing}/out" in err[0], err
    with pytest.raises(FileNotFoundError, match=f"bucket {missing} does not exist"):
        storage.read_bytes(f"{missing}/x")
    with pytest.raises(FileNotFoundError, match=f"{bucket.url}/missing.json does not exist"):
        storage.open_binary(f"{bucket.url}/missing.json")
    assert not storage.exists(f"{bucket.url}/missing.json")


def test_convert_from_a_bucket_to_a_bucket(bucket, tmp_path, caplog):
    """Folder and manifest inputs in the bucket, output in the bucket: the datasets pass
    validate --full there; no credentials lookup (the emulator needs none): no traceback.
    The folder's convert runs on the local default (no runner flag): one in-memory
    worker, as for a local folder (test_the_local_default_counts_a_bucket_input_...)."""
    from beam_jobs import convert

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=8, formats=("png",))
    (root / "notes.txt").write_text("not an image")
    images = bucket.upload(str(root), "in/images")
    # run_convert without its --direct_running_mode=in_memory: what convert chooses
    out = f"{bucket.url}/out"
    flags = ["--splits=train=0.5,val=0.5", "--max_reject_fraction=0.05"]
    info = convert.run([f"--input={images}", f"--output_dir={out}", *flags])
    assert validate(out, full=True) == []
    assert info["runner"] == "DirectRunner (in_memory, 1 worker)"
    assert info["inputs"] == 25 and info["rejects"]["total"] == 1
    lines = ["path,label"] + [
        f"images/label_{i % 3}/img_{i // 3:05d}.png,l{i % 3}" for i in range(9)
    ]
    lines.append("images/label_0/not_there.png,l0")  # a row naming no object: a reject
    bucket.put("in/manifest.csv", ("\n".join(lines) + "\n").encode())
    info = run_convert(
        f"{bucket.url}/in/manifest.csv",
        f"{bucket.url}/out_m",
        "--splits=train=1.0",
        "--max_reject_fraction=0.2",
    )
    assert info["splits"]["train"]["num_examples"] == 9
    assert info["rejects"]["by_reason"] == {"missing": 1}
    assert "Traceback" not in caplog.text and "credentials" not in caplog.text.lower()


def test_a_bucket_images_are_each_fetched_once(bucket, tmp_path, monkeypatch):
    """A bucket's small images carry their bytes from inspection to the shard writer:
    one request an image (two before: the writer fetched each again), the shards the
    same bytes as the same folder's convert from the local disk."""
    import collections

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png", "jpeg"))
    images = bucket.upload(str(root), "in/once")
    fetched = collections.Counter()
    read_range = storage.read_range

    def counted(path, size, start=0):
        fetched[path] += 1
        return read_range(path, size, start)

    monkeypatch.setattr(storage, "read_range", counted)
    flags = ("--splits=train=1.0", "--num_shards=2")
    run_convert(images, str(tmp_path / "from_bucket"), *flags)
    monkeypatch.setattr(storage, "read_range", read_range)
    shown = {p: n for p, n in fetched.items() if p.startswith(images)}
    assert len(shown) == 12 and set(shown.values()) == {1}, shown
    run_convert(str(root), str(tmp_path / "from_disk"), *flags)
    for shard in ("train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"):
        a, b = (open(tmp_path / d / shard, "rb").read() for d in ("from_bucket", "from_disk"))
        assert a == b, shard


def test_the_local_default_counts_a_bucket_input_as_it_counts_a_folder(bucket, tmp_path):
    """Below MULTI_PROCESSING_FROM inputs, one in-memory worker, for a bucket's folder or
    manifest too (a URL counted as large: 1,469 images in a bucket ran on every core).
    A convert of a bucket's folder on that default: test_convert_from_a_bucket_to_a_bucket."""
    from beam_jobs.input_size import has_at_least
    from convert_core.job import Job
    from convert_core.options import parse_args

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=3, formats=("png",))
    images = bucket.upload(str(root), "in/images")
    bucket.put("in/m.csv", b"path,label\nimages/label_0/img_00000.png,a\n\n")

    def counted(url: str, n: int) -> bool:
        return has_at_least(Job.of(parse_args([f"--input={url}", "--output_dir=o"])[0]), n)

    assert counted(images, 6) and not counted(images, 7)
    assert counted(f"{bucket.url}/in/m.csv", 1) and not counted(f"{bucket.url}/in/m.csv", 2)


def test_a_bucket_folder_of_record_files_says_which_input_format(bucket, tmp_path):
    """A bucket's folder of TFRecord files given as an image folder (as the emulator's
    convert line once said): the local folder's one line (was: every file an
    unsupported_format reject, "3000 of 3000 inputs were rejected")."""
    from test_one_line_errors import record_folders

    url = bucket.upload(record_folders(tmp_path)["tfrecord"], "in/rec")
    line = f"--input: folder '{url}' holds TFRecord files (r0.tfrecord), no images: add "
    with pytest.raises(UserError, match=re.escape(f"{line}--input_format=tfrecord")):
        run_convert(url, str(tmp_path / "out"))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_create_new_is_one_step_on_the_disk_and_in_the_bucket(where, bucket, tmp_path):
    """The lock's primitives: create only if absent (of 8 racing threads one wins),
    remove only the one taken (its token: inode, generation or ETag)."""
    if where == "local" and bucket.scheme != "gs":
        pytest.skip("the local disk is tested once")
    folder = str(tmp_path) if where == "local" else bucket.url
    path = f"{folder}/lock"
    token = storage.create_new(path, b"first")
    with pytest.raises(FileExistsError):
        storage.create_new(path, b"second")
    assert storage.read_versioned(path) == (b"first", token)
    another = storage.create_new(f"{folder}/another", b"another")
    assert not storage.remove_if(path, another) and storage.exists(path)
    assert storage.remove_if(path, token) and not storage.exists(path)
    assert not storage.remove_if(path, token)

    def create(i):
        try:
            storage.create_new(f"{folder}/raced", str(i).encode())
            return True
        except FileExistsError:
            return False

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(create, range(8))) == 1


def test_a_bucket_output_folder_is_locked_and_keeps_the_users_files(bucket, tmp_path, caplog):
    """A second convert into a bucket folder being written is refused (a lock object
    created only if absent); a dead run's lock is taken over; files of convert's names
    that convert did not write are refused, and kept.

    And convert into a bucket clears the incomplete folder (this was a test of its own,
    test_convert_into_a_bucket_clears_the_incomplete_folder, with a convert of its own):
    a bucket has no folders (FileSystems.exists is False for a prefix): .incomplete/
    stayed, and a temp shard of a killed run stayed through a rerun and --overwrite
    while validate called the dataset valid. Its objects are listed and removed, and
    validate names what is left there."""
    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=2, formats=("png",))
    lock = f"out/{layout.LOCK_FILE}"
    for holder in (
        {"pid": os.getpid(), "host": socket.gethostname()},
        {"pid": 1, "host": "elsewhere"},
    ):
        bucket.put(lock, json.dumps(holder).encode())
        with pytest.raises(UserError, match="being written by another convert"):
            run_convert(str(root), f"{bucket.url}/out")
    dead = subprocess.Popen(["true"])
    dead.wait()
    bucket.put(lock, json.dumps({"pid": dead.pid, "host": socket.gethostname()}).encode())
    out = f"{bucket.url}/out"
    info = run_convert(str(root), out, "--splits=train=1.0")
    assert info["splits"]["train"]["num_examples"] == 4
    assert "taking over the lock" in caplog.text and not bucket.exists(lock)

    incomplete = f"{out}/{layout.INCOMPLETE_DIR}"
    assert storage.listdir(incomplete) == []
    temp = f"out/{layout.INCOMPLETE_DIR}/train-00000-of-00001.tfrecord.{'0' * 32}"
    bucket.put(temp, b"half a shard, of a run killed while writing")
    problems = validate(out)
    assert len(problems) == 1 and f"{incomplete}: 1 file" in problems[0], problems
    # a rerun clears it (with --overwrite here; without, after a run that died, the
    # same list of earlier files: output.owned_files)
    run_convert(str(root), out, "--splits=train=1.0", "--overwrite")  # validated: no problem left
    assert storage.listdir(incomplete) == []

    users = f"mine/{layout.LABELS_FILE}"
    bucket.put(users, b"the user's own labels\n")
    with pytest.raises(UserError, match="evenshard did not write"):
        run_convert(str(root), f"{bucket.url}/mine")
    assert bucket.get(users) == b"the user's own labels\n"
    assert not bucket.exists(f"mine/{layout.LOCK_FILE}")


@on("gs")
def test_make_dataset_streams_a_bucket_through_a_bounded_cache(bucket, local_dataset, tmp_path):
    """Through the cache, the read is the local read, record for record; a limit below
    what a group reads at once is an error when the dataset is built."""
    import reader

    url = bucket.upload(local_dataset, "cached/out")
    shards = reader.load_info(url).split("train").shards
    limit = sum(s.num_bytes for s in shards) // 2  # 3 of the 6 shards
    # the runs and windows the cache reads in (random_access=False: on the folder too)
    opts = dict(seed=1, decode=False, epochs=2, cycle_length=2, random_access=False)
    local = reader.make_dataset(local_dataset, "train", 4, **opts)
    want = [k for b in local for k in b["key"].numpy()]
    cached = reader.make_dataset(
        url, "train", 4, cache_dir=str(tmp_path / "c"), cache_limit=limit, **opts
    )
    assert [k for b in cached for k in b["key"].numpy()] == want
    with pytest.raises(ValueError, match="cache_limit 10 bytes is smaller than the 2 largest"):
        reader.make_dataset(url, "train", 4, cache_dir=str(tmp_path / "d"), cache_limit=10, **opts)


@pytest.fixture
def downloads(monkeypatch):
    """Bytes the process fetched from a store, by the store calls the cache makes (they
    still fetch: this counts, it stands in for nothing)."""
    fetched = []
    read_range, download = storage.read_range, storage.download

    def counted_range(path, size, start=0):
        data = read_range(path, size, start)
        fetched.append(len(data))
        return data

    def counted_download(path, out):
        class Out:
            def write(self, chunk):
                fetched.append(len(chunk))
                return out.write(chunk)

        return download(path, Out())

    monkeypatch.setattr(storage, "read_range", counted_range)
    monkeypatch.setattr(storage, "download", counted_download)
    return fetched


@on("s3")
def test_a_tight_cache_downloads_each_byte_once_an_epoch(
    bucket, local_dataset, tmp_path, downloads, monkeypatch
):
    """Under a limit well below the worker's shards, the cache fetches runs (byte
    ranges), not shards: each shard's runs are read in different groups of an epoch, and
    a shard fetched whole for one run was evicted and fetched again for the next. Each
    byte of the split is downloaded at most once an epoch (a run whose cut points an epoch
    draws again may still be held), on tf.data and on the record source, and the read is
    the folder's, record for record; with a limit that holds the split, once in all."""
    import reader
    from reader.cache import fetch as cache_fetch
    from reader.records.source import RecordSource
    from reader.values.read_options import ReadOptions

    # runs fetched in pieces of 1,000 bytes: records span pieces, each still checked
    monkeypatch.setattr(cache_fetch, "RANGE_PIECE", 1000)
    url = bucket.upload(local_dataset, "runs/out")
    shards = reader.load_info(url).split("train").shards
    split = sum(s.num_bytes for s in shards)
    sizes = sorted(s.num_bytes for s in shards)
    opts = dict(seed=5, decode=False, epochs=3, cycle_length=2, random_access=False)
    want = [
        k for b in reader.make_dataset(local_dataset, "train", 4, **opts) for k in b["key"].numpy()
    ]
    for limit, most in ((sizes[-1] + sizes[-2], 3 * split), (split, split)):
        downloads.clear()
        cache = dict(cache_dir=str(tmp_path / f"tf{limit}"), cache_limit=limit)
        ds = reader.make_dataset(url, "train", 4, **opts, **cache)
        assert [k for b in ds for k in b["key"].numpy()] == want
        assert most - split < sum(downloads) <= most, limit

        downloads.clear()
        cache["cache_dir"] = str(tmp_path / f"source{limit}")
        source = RecordSource(url, "train", 4, ReadOptions(**opts, **cache))
        assert [k for b in source for k in b.key] == [k.decode() for k in want]
        assert most - split < sum(downloads) <= most, limit

    # resumed mid-epoch (the first group's runs moved past what they gave): the
    # folder's read from there, on both routes
    limit, at = sizes[-1] + sizes[-2], dict(start_epoch=1, start_step=5)
    later = [
        k
        for b in reader.make_dataset(local_dataset, "train", 4, **opts, **at)
        for k in b["key"].numpy()
    ]
    cache = dict(cache_dir=str(tmp_path / "resumed"), cache_limit=limit)
    resumed = reader.make_dataset(url, "train", 4, **opts, **at, **cache)
    assert [k for b in resumed for k in b["key"].numpy()] == later
    source = RecordSource(url, "train", 4, ReadOptions(**opts, **at, **cache))
    assert [k for b in source for k in b.key] == [k.decode() for k in later]


@on("gs")
def test_a_run_that_does_not_match_its_index_is_fetched_again_then_named(
    bucket, local_dataset, tmp_path
):
    """A run's copy is checked record by record (length and CRCs, as the index places
    them): a flipped byte is fetched again once, then named with the shard and its
    records."""
    import reader

    url = bucket.upload(local_dataset, "badrun/out")
    shards = load_info(url)["splits"]["train"]["shards"]
    name = shards[0]["file"]
    data = bytearray(bucket.get(f"badrun/out/{name}"))
    data[30] ^= 0xFF  # inside the first record's data: its CRC tells
    bucket.put(f"badrun/out/{name}", bytes(data))
    limit = 2 * max(s["num_bytes"] for s in shards)
    opts = dict(seed=1, decode=False, cycle_length=2, cache_limit=limit)
    ds = reader.make_dataset(url, "train", 4, cache_dir=str(tmp_path), **opts)
    with pytest.raises(Exception) as e:
        list(ds)
    line = reader.one_line(e.value)
    assert f"{url}/{name}: records 0-" in line and "twice: the object in the bucket" in line, line


@on("s3")
def test_the_cache_fetches_ahead_in_plan_order_within_its_limit(bucket, local_dataset, tmp_path):
    """The cache alone, against the bucket: a reader entering groups finds their shards
    local; the folder (sampled at every group) never holds more than the limit; two
    readers sharing the folder fetch a shard once between them when they overlap."""
    import threading

    from reader.cache.shard_cache import CacheOptions, ShardCache

    url = bucket.upload(local_dataset, "c2/out")
    info = load_info(url)
    shards = [{**s, "path": f"{url}/{s['file']}"} for s in info["splits"]["train"]["shards"]]
    size = max(s["num_bytes"] for s in shards)
    groups = [(0, 1), (2,), (3, 4), (5, 0), (1, 2), (3,), (4, 5)] * 2
    limit = 3 * size
    folder = str(tmp_path / "cache")

    def on_disk() -> int:
        seen = {}
        for name in os.listdir(folder):
            try:
                st = os.stat(os.path.join(folder, name))
            except FileNotFoundError:  # evicted meanwhile
                continue
            if not name.endswith(".lock"):
                seen[st.st_ino] = st.st_size  # a shard and its readers' links: one copy
        return sum(seen.values())

    cache = ShardCache(shards, lambda: iter(groups), CacheOptions(folder, limit, in_flight=2))
    for group in groups:
        paths = cache.enter(group)
        assert all(os.path.getsize(p) == shards[i]["num_bytes"] for p, i in zip(paths, group))
        assert on_disk() <= limit
    assert cache.peak <= limit and cache.fetched >= 6
    cache.close()
    assert on_disk() == 0  # nothing of it left behind

    # two readers, the same groups, one folder: one download a shard, both read it
    pair = [
        ShardCache(shards, lambda: iter(groups[:3]), CacheOptions(folder, 10 * size)) for _ in "ab"
    ]
    done = [threading.Thread(target=lambda c=c: [c.enter(g) for g in groups[:3]]) for c in pair]
    for t in done:
        t.start()
    for t in done:
        t.join()
    assert sum(c.fetched for c in pair) == 5  # shards 0-4, each once
    for c in pair:
        c.close()


@on("gs")
def test_a_dataset_from_a_bucket_is_iterated_again_as_keras_does(bucket, local_dataset, tmp_path):
    """Each pass over the dataset (each Keras epoch, each ``for`` over it) starts the
    cache's fetching over: the same records as the local dataset's passes, with a limit
    that holds the split and with the smallest allowed; Keras fit runs its epochs."""
    import keras

    import reader

    url = bucket.upload(local_dataset, "again/out")
    sizes = sorted(s["num_bytes"] for s in load_info(url)["splits"]["train"]["shards"])
    opts = dict(seed=2, decode=False, cycle_length=2, random_access=False)

    def passes(data_dir, **cache):
        ds = reader.make_dataset(data_dir, "train", 4, **opts, **cache)
        first = [k for b in ds for k in b["key"].numpy()]
        half = [k for b in ds.take(3) for k in b["key"].numpy()]  # a pass left early
        return first, half, [k for b in ds for k in b["key"].numpy()]

    want = passes(local_dataset)
    for limit in (sum(sizes) + 1, sizes[-1] + sizes[-2]):
        assert passes(url, cache_dir=str(tmp_path / str(limit)), cache_limit=limit) == want

    train = reader.make_dataset(
        url, "train", 8, seed=0, image_size=(8, 8), as_supervised=True, cache_dir=str(tmp_path)
    )
    model = keras.Sequential(
        [keras.layers.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert len(model.fit(train, epochs=2, verbose=0).history["loss"]) == 2


@on("s3")
def test_an_endless_read_that_the_cache_holds_does_not_walk_the_plan_ahead(
    bucket, local_dataset, tmp_path
):
    """With every shard held, there is nothing to fetch: the fetching still stays at
    most AHEAD groups ahead of the reader (an endless read would otherwise be walked
    forever, on a core of its own), and forgets the groups the reader left."""
    import itertools
    import time

    from reader.cache.shard_cache import AHEAD, LOOKAHEAD, CacheOptions, ShardCache

    url = bucket.upload(local_dataset, "endless/out")
    shards = [
        {**s, "path": f"{url}/{s['file']}"} for s in load_info(url)["splits"]["train"]["shards"]
    ]
    walked = itertools.count()
    pairs = [(0, 1), (2, 3), (4, 5)]

    def endless():
        for group in itertools.cycle(pairs):
            next(walked)
            yield group

    cache = ShardCache(shards, endless, CacheOptions(str(tmp_path), 10**9))
    try:
        time.sleep(1.0)
        assert next(walked) <= AHEAD + LOOKAHEAD + 1
        for group in itertools.islice(itertools.cycle(pairs), 3 * AHEAD):
            cache.enter(group)
        time.sleep(0.2)
        assert next(walked) <= 4 * AHEAD + LOOKAHEAD + 3
        assert len(cache._ahead) <= 2 * AHEAD + 1 and cache.fetched == 6
    finally:
        cache.close()


@on("gs")
def test_a_shard_that_does_not_match_its_listing_is_fetched_again_then_named(
    bucket, local_dataset, tmp_path, capsys
):
    import reader

    url = bucket.upload(local_dataset, "bad/out")
    shard = load_info(url)["splits"]["train"]["shards"][0]["file"]
    data = bytearray(bucket.get(f"bad/out/{shard}"))
    data[100] ^= 0xFF  # same size, other bytes: only the sha256 tells
    bucket.put(f"bad/out/{shard}", bytes(data))
    ds = reader.make_dataset(url, "train", 4, seed=1, decode=False, cache_dir=str(tmp_path))
    with pytest.raises(Exception, match=f"{shard}: sha256 differs from the one listed, twice") as e:
        list(ds)
    # inside tf.data the error is TensorFlow's, with a traceback: reader.one_line unwraps it
    # (evenshard's DatasetError: its message alone, as the dataset's iterator raises it)
    line = (
        f"{url}/{shard}: sha256 differs from the one listed, twice: the object "
        "in the bucket does not match dataset_info.json (convert again, or restore it)"
    )
    assert reader.one_line(e.value) == line
    png = str(tmp_path / "r.png")
    assert cli.main(["shuffle-report", url, "--out", png, "--batch_size", "4"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"evenshard shuffle-report: error: {line}"
    ]
    # a shard gone from the bucket is said when the dataset is built
    bucket.delete(f"bad/out/{shard}")
    assert cli.main(["shuffle-report", url, "--out", png, "--batch_size", "4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{url}/{shard} listed in dataset_info.json is missing" in err[0]


@on("s3")
def test_a_sha256_naming_a_path_is_refused_and_the_users_files_stay(
    bucket, local_dataset, tmp_path
):
    """Issue 27: a hand-edited sha256 named the copy's path: "../victim/x" made the reader
    read a user's file of the listed size as the shard (no hash check), link it and delete
    it; an absolute one too; a number crashed. Each is one line naming shard and field."""
    import tempfile

    import reader

    url = bucket.upload(local_dataset, "hostile/out")
    info = json.loads(bucket.get(f"hostile/out/{layout.INFO_FILE}"))
    shard = info["splits"]["train"]["shards"][0]
    far = tempfile.mkdtemp(prefix="v")  # short: an absolute sha256 keeps 32 characters
    try:
        (tmp_path / "victim").mkdir()
        for key, planted in (
            ("../victim/x", tmp_path / "victim" / f"x-{shard['file']}"),
            (f"{far}/x", f"{far}/x-{shard['file']}"),
            (7, None),
        ):
            if planted:
                with open(planted, "wb") as f:
                    f.write(b"the user's" + b"\0" * (shard["num_bytes"] - 10))
            shard["sha256"] = key
            bucket.put(f"hostile/out/{layout.INFO_FILE}", json.dumps(info).encode())
            want = f"shard {shard['file']}: sha256 {key!r} is not 64 lowercase hex digits"
            with pytest.raises(DatasetError, match=re.escape(want)) as e:
                ds = reader.make_dataset(
                    url, "train", 4, cache_dir=str(tmp_path / "c"), decode=False
                )
                list(ds)
            assert "\n" not in str(e.value)
        for folder in (tmp_path / "victim", far):
            (name,) = os.listdir(folder)  # the user's file, and nothing of the cache's
            with open(os.path.join(folder, name), "rb") as f:
                assert f.read(10) == b"the user's"
    finally:
        shutil.rmtree(far)


@on("gs")
def test_a_dataset_converted_again_at_the_same_url_is_not_read_from_stale_copies(bucket, tmp_path):
    """Cached copies are named by content: a dataset converted again into the same URL
    (another seed: a shard of the same name and size, other bytes) reads its new shards,
    in a cache folder that still holds the old ones."""
    import reader

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png",))
    local = {}
    for seed in (1, 2):
        local[seed] = str(tmp_path / f"out{seed}")  # convert's bytes, without a Beam run
        write_dataset(
            str(root), local[seed], "--splits=train=1.0", "--num_shards=1", f"--seed={seed}"
        )
    opts = dict(seed=0, decode=False, shuffle=False)

    def keys(data_dir):
        ds = reader.make_dataset(data_dir, "train", 4, cache_dir=str(tmp_path / "c"), **opts)
        return [k for b in ds for k in b["key"].numpy()], ds

    url = bucket.upload(local[1], "again/out")
    first, kept = keys(url)  # kept: its copies stay in the folder
    assert first == keys(local[1])[0]
    bucket.upload(local[2], "again/out")
    shard = load_info(url)["splits"]["train"]["shards"][0]
    assert shard["num_bytes"] == load_info(local[1])["splits"]["train"]["shards"][0]["num_bytes"]
    assert keys(url)[0] == keys(local[2])[0] != first


@on("s3")
def test_shuffle_report_reads_a_bucket_through_the_default_cache(
    bucket, local_dataset, tmp_path, monkeypatch, capsys
):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the default cache folder's parent
    url = bucket.upload(local_dataset, "report/out")
    png = tmp_path / "report.png"
    assert (
        cli.main(["shuffle-report", url, "--out", str(png), "--batch_size", "8", "--baseline"]) == 0
    )
    assert png.stat().st_size > 0 and "label mix" in capsys.readouterr().out
    assert os.listdir(tmp_path / f"evenshard-cache-{os.getuid()}")  # the user's own


@on("gs")
def test_a_read_resumed_with_another_worker_count_from_a_bucket(bucket, local_dataset, tmp_path):
    """Elastic resume from a bucket: the lead (what the old workers left) is fetched by
    offset, one ranged request a record; the read equals the local one, on tf.data
    and on the record source of DALI and Torch."""
    import reader
    from reader.records.source import RecordSource
    from reader.values.read_options import ReadOptions

    url = bucket.upload(local_dataset, "elastic/out")
    state = reader.ReadState(seed=5, batch_size=4, epoch=0, step=2, num_workers=3)
    opts = dict(decode=False, epochs=2, cycle_length=2, random_access=False)

    def keys(data_dir, **cache):
        ds, _ = reader.resume(data_dir, "train", state, ReadOptions(**opts, **cache))
        return [k for b in ds for k in b["key"].numpy()]

    want = keys(local_dataset)
    assert keys(url, cache_dir=str(tmp_path)) == want
    source = RecordSource(url, "train", 4, ReadOptions(**opts, cache_dir=str(tmp_path)), state)
    assert [k.encode() for b in source for k in b.key] == want


@on("gs")
def test_path_records_whose_images_are_in_a_bucket(bucket, tmp_path):
    """Convert to path records from a bucket; the readers fetch the images through the
    store, a batch's at once: the same images as image records of the same input."""
    import numpy as np

    import reader
    from reader.torch import TorchReader

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png", "jpeg"))
    images = bucket.upload(str(root), "in/images")
    flags = ("--splits=train=1.0", "--num_shards=2", "--seed=3")
    run_convert(images, f"{bucket.url}/paths", "--record_kind=path", *flags)
    run_convert(images, f"{bucket.url}/images", *flags)
    opts = dict(seed=1, image_size=(16, 16), cache_dir=str(tmp_path / "c"))
    got, want = (
        list(reader.make_dataset(f"{bucket.url}/{kind}", "train", 4, **opts))
        for kind in ("paths", "images")
    )
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        assert list(a["key"].numpy()) == list(b["key"].numpy())
        assert np.array_equal(a["image"].numpy(), b["image"].numpy())
    one = next(iter(reader.make_dataset(f"{bucket.url}/paths", "train", None, **opts)))
    assert one["image"].shape == (16, 16, 3)
    paths = TorchReader(f"{bucket.url}/paths", "train", 4, backend="dali", **opts)
    torch_keys = [b["key"] for b in paths]
    assert torch_keys == [[k.decode() for k in b["key"].numpy()] for b in want]


@on("s3")
def test_torch_reader_reads_a_bucket_through_the_cache(bucket, local_dataset, tmp_path):
    from reader.torch import TorchReader

    url = bucket.upload(local_dataset, "torch/out")
    kw = dict(image_size=(8, 8), seed=3, backend="tf", random_access=False)
    want = [b["key"] for b in TorchReader(local_dataset, "train", 8, **kw)]
    got = [b["key"] for b in TorchReader(url, "train", 8, cache_dir=str(tmp_path), **kw)]
    assert got == want
    kw["backend"] = "dali"
    want = [b["key"] for b in TorchReader(local_dataset, "train", 8, **kw)]
    assert [b["key"] for b in TorchReader(url, "train", 8, cache_dir=str(tmp_path), **kw)] == want


@pytest.mark.parametrize(
    "opts, bucket",
    [
        (dict(seed=1, epochs=2, cycle_length=2, shuffle_buffer=8), "s3"),
        (
            dict(seed=2, epochs=3, cycle_length=3, shuffle_buffer=5, num_workers=2, worker_index=1),
            "gs",
        ),
        (
            dict(seed=3, epochs=2, cycle_length=2, shuffle_buffer=8, start_epoch=1, start_step=1),
            "s3",
        ),
        (dict(seed=4, epochs=2, cycle_length=1, num_workers=8, worker_index=5), "gs"),
        (dict(shuffle=False, epochs=1, cycle_length=2, pad_final_batch=True), "s3"),
    ],
    ids=[
        "windows-s3",
        "two-workers-gs",
        "resumed-mid-window-s3",
        "shared-shards-gs",
        "unshuffled-s3",
    ],
    indirect=["bucket"],
)
def test_the_record_source_reads_a_bucket_through_the_cache_as_it_reads_the_folder(
    opts, bucket, local_dataset, tmp_path
):
    """The DALI and Torch readers' source: through the cache, at the smallest limit it
    allows (windows span groups: each is read as its groups give it), the read is the
    folder's, record for record."""
    from reader.records.source import RecordSource
    from reader.values.read_options import ReadOptions

    def source(data_dir, **cache):  # (the cache's runs and windows on the folder too)
        o = ReadOptions(decode=False, random_access=False, **opts, **cache)
        return RecordSource(data_dir, "train", 4, o)

    def keys(data_dir, **cache):
        return [b.key for b in source(data_dir, **cache)]

    url = bucket.upload(local_dataset, "source/out")
    sizes = sorted(s["num_bytes"] for s in source(local_dataset).read.sources[0].share.shards)
    limit = sum(sizes[-opts["cycle_length"] :])
    want = keys(local_dataset)
    assert keys(url, cache_dir=str(tmp_path), cache_limit=limit) == want
    with pytest.raises(ValueError, match="cache_limit .* is smaller than"):
        keys(url, cache_dir=str(tmp_path), cache_limit=limit - 1)


@on("gs")
def test_the_readmes_bucket_workflow_as_written(bucket, tmp_path, monkeypatch):
    """README, "Train from the bucket": its commands and its code, with the bucket, the
    image folder and the cache folder of this test in place of the README's."""
    import re
    import shlex

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    section = readme.split("### Train from the bucket", 1)[1].split("\n### ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    photos = tmp_path / "photos"
    synthetic.make_image_folder(str(photos), num_labels=3, per_label=30, formats=("jpeg",))

    def ours(text: str) -> str:
        return text.replace("gs://bucket/ds", f"{bucket.url}/ds").replace(
            "/mnt/local-ssd/evenshard", str(tmp_path / "cache")
        )

    monkeypatch.chdir(tmp_path)  # photos/ is the README's relative folder
    for line in ours(commands).strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == ".venv/bin/evenshard"
        assert cli.main(argv[1:]) == 0, line
    namespace: dict = {}
    exec(ours(code), namespace)
    images, labels = namespace["images"], namespace["labels"]
    assert images.shape == (32, 64, 64, 3) and labels.shape == (32,)
    assert os.listdir(tmp_path / "cache")


def test_a_dataloader_worker_reads_a_bucket(gcs_server, s3_server, local_dataset, tmp_path):
    """The reader read in the parent first, then in a DataLoader worker: the worker
    starts a cache of its own (its fetching thread is not inherited) and reads the same
    batches. A forked worker inherits the parent's store client: forked on each store;
    spawned (a fresh process, above the IO layer) once. One training script reads both
    buckets (one start of torch, DALI and TensorFlow; the stores' cases were a script
    each), the forks before TensorFlow starts in it."""
    from test_frameworks import DATALOADER_RECIPE

    urls = {
        store: Bucket(store, client, f"t-loader-{store}").upload(local_dataset, "loader/out")
        for store, client in (("gs", gcs_server), ("s3", s3_server))
    }
    recipe = DATALOADER_RECIPE.split('if __name__ == "__main__":')[0]
    script = tmp_path / "loader.py"
    script.write_text(
        recipe
        + """if __name__ == "__main__":  # the cases in order: [data_dir, *case's args]
    out = {}
    for data_dir, *args in json.loads(sys.argv[1]):
        out[" ".join([data_dir, *args])] = case(data_dir, *args)
        print(json.dumps(out), flush=True)
"""
    )
    cases = [
        (urls["gs"], "dali", "1", "1", "fork"),
        (urls["s3"], "dali", "1", "1", "fork"),
        (urls["gs"], "tf", "1", "1", "spawn"),
    ]
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(outcomes) == sorted(" ".join(c) for c in cases), done.stdout
    assert all(got.startswith("read") for got in outcomes.values()), outcomes


def test_the_servers_own_log_shows_a_tight_cache_fetching_the_split_once_an_epoch(
    local_dataset, tmp_path
):
    """The loopback GCS server logs each download it answers (object, bytes): the
    benchmarks count egress by it. Two epochs at the smallest limit allowed: every
    byte fetched at most twice, each line a train shard, ranged (less than a shard)."""
    import reader
    from evenshard.emulator import gcs_emulator, upload

    log = str(tmp_path / "requests.log")
    shards = reader.load_info(local_dataset).split("train").shards
    split, sizes = sum(s.num_bytes for s in shards), sorted(s.num_bytes for s in shards)
    with gcs_emulator(log=log) as client:
        url = upload(client.create_bucket("logged"), local_dataset, "ds")
        with open(log, "a"):
            pass  # the reads below are what is logged
        before = os.path.getsize(log)
        ds = reader.make_dataset(
            url,
            "train",
            4,
            seed=7,
            decode=False,
            epochs=2,
            cycle_length=2,
            cache_dir=str(tmp_path / "c"),
            cache_limit=sizes[-1] + sizes[-2],
        )
        assert sum(int(b["label"].shape[0]) for b in ds) == 2 * sum(s.num_examples for s in shards)
    with open(log) as f:
        f.seek(before)
        lines = [line.rstrip("\n").split("\t") for line in f]
    files = {s.file: s.num_bytes for s in shards}
    fetched = [(name.rsplit("/", 1)[-1], int(n)) for name, n in lines if name.endswith(".tfrecord")]
    assert fetched and all(f in files and n <= files[f] for f, n in fetched)
    assert any(n < files[f] for f, n in fetched)  # ranged: runs, not shards
    assert split < sum(n for _, n in fetched) <= 2 * split


@pytest.mark.parametrize("store", ["gs", "s3"])
def test_one_command_serves_a_folder_in_a_bucket_until_ctrl_c(store, tmp_path):
    """The README's way to try buckets on one machine: the server starts with the folder
    uploaded, says how to point another shell at it, the command it prints converts
    there, and Ctrl-C stops it (exit 0, the port closed)."""
    import signal
    import threading

    photos = tmp_path / "photos"
    synthetic.make_image_folder(str(photos), num_labels=2, per_label=4, formats=("png",))
    argv = [sys.executable, "-m", "evenshard.emulator", store, str(photos), "--bucket=mine"]
    serving = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    watchdog = threading.Timer(120, serving.kill)  # a hang fails the test, never blocks it
    watchdog.start()
    said = []
    for line in serving.stdout:
        said.append(line)
        if line.startswith("Ctrl-C"):
            break
    assert said[0] == f"serving {store}://mine/photos on 127.0.0.1 (in memory); in another shell:\n"
    env = dict(os.environ, **dict(v.split("=", 1) for v in said[1].split()[1:]))
    command = said[2].split()
    assert command[0] == ".venv/bin/evenshard"  # the repository's, as the README runs it
    command[0] = os.path.join(os.path.dirname(sys.executable), "evenshard")
    convert = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert convert.returncode == 0, convert.stderr[-2000:]
    assert "8 inputs -> 8 written" in convert.stdout
    port = int(env["STORAGE_EMULATOR_HOST" if store == "gs" else "AWS_ENDPOINT_URL"].split(":")[-1])
    os.killpg(serving.pid, signal.SIGINT)  # as a terminal sends Ctrl-C
    assert serving.wait(timeout=30) == 0 and serving.stdout.read() == "stopped\n"
    watchdog.cancel()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_the_servers_end_with_the_process_that_started_them():
    """A process killed with kill -9 runs no ``finally``: its GCS and S3 servers end
    anyway (each watches a pipe only that process held), no server left behind."""
    import signal
    import time

    script = (
        "import os, signal\n"
        "from evenshard.emulator import gcs_emulator, s3_server\n"
        "with gcs_emulator(), s3_server():\n"
        "    print(os.environ['STORAGE_EMULATOR_HOST'].rsplit(':', 1)[1],\n"
        "          os.environ['AWS_ENDPOINT_URL'].rsplit(':', 1)[1], flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    ports = [int(port) for port in done.stdout.split()]
    assert len(ports) == 2
    deadline = time.monotonic() + 30  # they end in well under a second
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break  # refused: the server is gone
            assert time.monotonic() < deadline, f"a server still answers on port {port}"
            time.sleep(0.1)
