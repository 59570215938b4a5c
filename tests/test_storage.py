"""The one way to files (``schemas.storage``): globs as Beam's FileSystems.match finds
them, locally and in a bucket; a file written whole or not at all; removal; and the
store clients made once a process, forgotten in a forked child."""

from __future__ import annotations

import os

import pytest

from schemas import storage, stores

FILES = ("a.tfrecord", "b.tfrecord.gz", "x/c.tfrecord", "x/y/d.tfrecord", "x/e.txt", "f[1].txt")
PATTERNS = (
    "*.tfrecord",
    "*.tfrecord*",
    "**.tfrecord",
    "**",
    "x/*",
    "x/**",
    "*/*.tfrecord",
    "?.tfrecord",
    "[ab].tfrecord*",
    "[!a].tfrecord*",
    "a.tfrecord",
    "nothing*",
    "x/y/d.tfrecord",
)


def _tree(root) -> str:
    for rel in FILES:
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(rel.encode())
    return str(root)


@pytest.mark.fast
def test_a_glob_matches_what_beams_match_finds_locally(tmp_path):
    from apache_beam.io.filesystems import FileSystems

    root = _tree(tmp_path / "in")
    for pattern in PATTERNS:
        beams = FileSystems.match([f"{root}/{pattern}"])[0].metadata_list
        want = sorted((m.path, m.size_in_bytes) for m in beams)
        assert storage.match(f"{root}/{pattern}") == want, pattern
    assert len(storage.match(f"{root}/**", limit=2)) == 2


def test_a_glob_matches_the_same_files_in_a_bucket(bucket, tmp_path):
    local = _tree(tmp_path / "in")
    url = bucket.upload(local, "in")
    for pattern in PATTERNS:
        here = [(p[len(local) :], n) for p, n in storage.match(f"{local}/{pattern}")]
        there = [(p[len(url) :], n) for p, n in storage.match(f"{url}/{pattern}")]
        assert there == here, pattern


@pytest.mark.fast
def test_a_file_is_written_whole_or_not_at_all(tmp_path):
    path = str(tmp_path / "deep" / "f.bin")
    with pytest.raises(RuntimeError):
        with storage.writer(path) as f:
            f.write(b"half")
            raise RuntimeError("the writer died")
    assert not os.path.exists(path) and os.listdir(tmp_path / "deep") == []  # no temp left
    temp = tmp_path / "temp"
    with storage.writer(path, str(temp)) as f:
        f.write(b"whole")
        assert [n.startswith("f.bin.tmp-") for n in os.listdir(temp)] == [True]
        assert not os.path.exists(path)  # not before the block ends
    assert open(path, "rb").read() == b"whole" and os.listdir(temp) == []
    storage.delete([path, str(tmp_path / "never")])  # a missing file is no error
    assert not os.path.exists(path)
    assert storage.files_under(str(temp)) == [str(temp)]
    storage.delete(storage.files_under(str(temp)))
    assert not temp.exists() and storage.files_under(str(temp)) == []


def test_an_object_is_written_whole_or_not_at_all(bucket, monkeypatch):
    url = f"{bucket.url}/out/f.bin"
    with pytest.raises(RuntimeError):
        with storage.writer(url) as f:
            f.write(b"half")
            raise RuntimeError("the writer died")
    assert not storage.exists(url)
    monkeypatch.setattr(storage, "SPOOL_BYTES", 10)  # past it, spooled to disk
    with storage.writer(url) as f:
        f.write(b"a whole object, more than ten bytes")
    assert storage.read_bytes(url) == b"a whole object, more than ten bytes"
    storage.write_atomically(f"{bucket.url}/out/g/h.bin", b"")  # an empty object too
    assert storage.files_under(f"{bucket.url}/out") == [url, f"{bucket.url}/out/g/h.bin"]
    storage.delete(storage.files_under(f"{bucket.url}/out"))
    assert storage.files_under(f"{bucket.url}/out") == []
    storage.delete([url])  # gone already: no error


@pytest.mark.fast
def test_other_url_schemes_are_refused_in_one_line(tmp_path):
    for call in (
        lambda: storage.match("hdfs://host/x/*"),
        lambda: storage.write_atomically("hdfs://host/x", b""),
        lambda: storage.delete(["hdfs://host/x"]),
    ):
        with pytest.raises(ValueError, match="local paths, gs:// and s3:// only"):
            call()


def test_a_forked_child_makes_its_own_client(s3_server):
    client = stores.S3.client()
    assert stores.S3.client() is client  # one a process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no client until it asks, then its own
        os.write(write, b"1" if stores.S3._client is None else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)
    assert stores.S3.client() is client


@pytest.mark.fast
def test_google_credentials_without_a_project_are_used_not_dropped(tmp_path, monkeypatch):
    """Credentials found but no project (`gcloud auth application-default login` with no
    project set): gs:// is reached with them (a bucket's objects need no project), not
    anonymously as if there were none."""
    from google.auth.credentials import AnonymousCredentials

    adc = tmp_path / "adc.json"
    adc.write_text(
        '{"type": "authorized_user", "client_id": "x.apps.googleusercontent.com", '
        '"client_secret": "s", "refresh_token": "r"}'
    )
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setattr(stores.GCS, "_client", None)
    client = stores.GCS.client()
    assert not isinstance(client._credentials, AnonymousCredentials)


def test_a_folder_named_with_wildcards_is_listed_as_itself(bucket, tmp_path):
    """``match(pattern, folder=...)``: the folder's ``*``, ``?`` and ``[`` are no
    pattern, locally and in a bucket (a sibling folder is not listed with it)."""
    local = tmp_path / "in"
    for rel in ("odd[1]/a.tfrecord", "odd[1]/x/b.tfrecord", "odd1/c.tfrecord", "odd*/d.txt"):
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(b"12")
    url = bucket.upload(str(local), "in")
    for root in (str(local), url):
        found = [p[len(root) :] for p, _ in storage.match("**", folder=f"{root}/odd[1]")]
        assert found == ["/odd[1]/a.tfrecord", "/odd[1]/x/b.tfrecord"], root
        found = [p[len(root) :] for p, _ in storage.match("*.tfrecord", folder=f"{root}/odd[1]")]
        assert found == ["/odd[1]/a.tfrecord"], root
        assert [p[len(root) :] for p, _ in storage.match("*", folder=f"{root}/odd*")] == [
            "/odd*/d.txt"
        ], root
    assert [p[len(url) :] for p in storage.files_under(f"{url}/odd*")] == ["/odd*/d.txt"]
