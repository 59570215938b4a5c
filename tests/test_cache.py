"""The bounded cache of a bucket's shards (reader/cache/shard_cache.py) against a hostile folder or
dataset_info.json, dead readers and a full disk (issue 27). Shards here are random bytes
in a loopback bucket: the cache reads bytes, not records."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import stat

import numpy as np
import pytest

from reader.cache.shard_cache import CacheOptions, ShardCache, open_cache
from schemas.info import DatasetError

pytestmark = pytest.mark.slow


def _shards(bucket, n: int = 4, size: int = 3000, prefix: str = "ds") -> list[dict]:
    """``n`` shards of random bytes put in the bucket, listed as the reader lists them."""
    rng = random.Random(n * size)
    shards = []
    for i in range(n):
        data = rng.randbytes(size)
        name = f"train-{i:05d}-of-{n:05d}.tfrecord"
        bucket.put(f"{prefix}/{name}", data)
        digest = hashlib.sha256(data).hexdigest()
        shards.append(
            {"path": f"{bucket.url}/{prefix}/{name}", "num_bytes": size, "sha256": digest}
        )
    return shards


@pytest.mark.parametrize("key", ["../victim/x", "/tmp/x", 7, "AB" * 32])
def test_a_sha256_that_is_not_a_digest_cannot_name_a_path(key, tmp_path):
    """Defence in depth under schemas.info: the cache itself refuses a sha256 that would
    name a file outside its folder, when it is built, before any file is made."""
    (tmp_path / "victim").mkdir()
    shards = [{"path": "gs://b/d/train-00000-of-00001.tfrecord", "num_bytes": 9, "sha256": key}]
    with pytest.raises(DatasetError, match="sha256 .* is not 64 lowercase hex digits"):
        ShardCache(shards, lambda: iter([(0,)]), CacheOptions(str(tmp_path / "c"), 100))
    assert os.listdir(tmp_path / "victim") == []


def _open(shards: list[dict], groups: list[tuple], cache_dir: str | None = None) -> ShardCache:
    """The cache as a reader opens it (``open_cache``), for these groups, 1 MB at most."""
    from types import SimpleNamespace

    from reader.order.plan import Runs

    runs = [Runs(np.array(g), np.zeros(len(g), int), np.ones(len(g), int)) for g in groups]
    plan = SimpleNamespace(cycle=1, seed=0, groups=lambda start, epochs: iter(runs))
    read = SimpleNamespace(shards=shards, plan=plan, start=0)
    return open_cache(read, SimpleNamespace(cache_dir=cache_dir, cache_limit=10**6, epochs=1))


@contextlib.contextmanager
def tempfile_dir(folder: str):
    """``tempfile.gettempdir()`` is ``folder`` meanwhile (where the default cache goes)."""
    import tempfile

    saved, tempfile.tempdir = tempfile.tempdir, folder
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _read(cache: ShardCache, group: tuple[int, ...]) -> list[bytes]:
    """The bytes the reader reads for ``group``."""
    out = []
    for path in cache.enter(group):
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def _plant(folder, shards: list[dict], uid: int | None = None) -> list[str]:
    """Files another user puts in ``folder`` in place of copies of ``shards``: the copies'
    names and sizes, other bytes (owned by ``uid`` when given: we run as root)."""
    os.makedirs(folder, exist_ok=True)
    planted = []
    for s in shards:
        path = os.path.join(folder, f"{s['sha256'][:32]}-{os.path.basename(s['path'])}")
        with open(path, "wb") as f:
            f.write(b"planted".ljust(s["num_bytes"], b"!"))
        planted.append(path)
        if uid is not None:
            os.chown(path, uid, uid)
    return planted


def _another_uid() -> int | None:
    """A uid that is not ours, to own files as another user would (root only: chown)."""
    return 65534 if os.getuid() == 0 else None


def test_the_default_folder_is_the_users_own_and_refused_when_others_can_write_it(
    bucket, tmp_path, monkeypatch
):
    """Issue 27: another user pre-created the shared default folder (0777) and put files
    of the copies' names and sizes there: a read returned them. The default is now
    evenshard-cache-<uid>, made 0700, refused (one line) when it is another user's or
    writable by group or others; no planted byte is ever read."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shards = _shards(bucket)
    want = [bucket.get(s["path"].split("/", 3)[3]) for s in shards]
    other = _another_uid()
    for name in ("evenshard-cache", f"evenshard-cache-{os.getuid()}"):  # the old name, the new
        folder = tmp_path / name
        _plant(folder, shards, other)
        os.chmod(folder, 0o777)
        if other is not None:
            os.chown(folder, other, other)
    problem = "owned by uid 65534, not by you" if other is not None else "writable by group"
    with pytest.raises(DatasetError, match=f"cache folder .*-{os.getuid()} is {problem}") as e:
        with _open(shards, [(0, 1)]) as cache:
            assert _read(cache, (0, 1)) == want[:2]
    assert "\n" not in str(e.value) and "remove it" in str(e.value)
    if other is not None:
        os.chown(tmp_path / f"evenshard-cache-{os.getuid()}", os.getuid(), os.getgid())
        with pytest.raises(DatasetError, match=r"writable by group or others \(mode 0o777\)"):
            _open(shards, [])
    shutil.rmtree(tmp_path / f"evenshard-cache-{os.getuid()}")
    groups = [(0, 1), (2, 3)]
    with _open(shards, groups) as cache:
        assert [b for g in groups for b in _read(cache, g)] == want
        st = os.stat(cache.folder)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_cache_dir_others_can_write_gets_a_folder_of_the_users_own(bucket, tmp_path):
    """A given cache_dir that is sticky (1777, as /tmp): the copies go in a folder of the
    user's inside it, and planted files beside it are never read; a non-sticky one that
    others can write, or one of another user's, is refused in one line."""
    shards = _shards(bucket)
    want = [bucket.get(s["path"].split("/", 3)[3]) for s in shards]
    shared = tmp_path / "shared"
    planted = _plant(shared, shards, _another_uid())
    os.chmod(shared, 0o1777)
    with ShardCache(shards, lambda: iter([(0, 1, 2, 3)]), CacheOptions(str(shared), 10**6)) as c:
        assert _read(c, (0, 1, 2, 3)) == want
        assert c.folder == str(shared / f"evenshard-{os.getuid()}")
    for path in planted:
        with open(path, "rb") as f:
            assert f.read(7) == b"planted"
    os.chmod(shared, 0o777)
    with pytest.raises(DatasetError, match=r"mode 0o777\) is not a folder only you can write"):
        ShardCache(shards, lambda: iter([]), CacheOptions(str(shared), 10**6))
    if _another_uid() is not None:
        os.chmod(shared, 0o755)
        os.chown(shared, _another_uid(), _another_uid())
        with pytest.raises(DatasetError, match="owner uid 65534, mode 0o755"):
            ShardCache(shards, lambda: iter([]), CacheOptions(str(shared), 10**6))


def _as_user(uid: int, fn, *args) -> tuple[int, str]:
    """``fn(*args)`` in a forked child running as ``uid`` (root only), a real second user
    of the machine (fork, not exec: this Python lies in a folder other users cannot
    read); its exit status (0: returned) and what it returned, or its traceback."""
    import signal
    import traceback

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code, out = 1, ""
        try:
            os.close(read)
            signal.alarm(120)  # a hang is a failure, not a stuck test
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out, code = str(fn(*args)), 0
        except BaseException:  # noqa: BLE001 - the test shows it
            out = traceback.format_exc()
        finally:
            os.write(write, out.encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        out = f.read().decode()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out


def _second_user_reads(shards: list[dict], cache_dir: str | None) -> str:
    from schemas import stores

    stores.GCS._client = stores.S3._client = None  # connections of its own
    try:
        with _open(shards, [(0, 1)], cache_dir) as cache:
            _read(cache, (0, 1))
            return f"read {os.path.dirname(cache.local(0))}"
    except DatasetError as e:
        return f"refused {e}"


def test_a_second_user_of_the_machine_reads_with_a_folder_of_its_own(bucket, tmp_path):
    """Issue 27's converse: the first user made the shared default (umask 022), and the
    second user's read died on a .lock with a 41-line PermissionError. A real second user
    (nobody, by setuid: root only) now reads through a default of its own; given the first
    user's folder, it is told so in one line."""
    import pwd
    import tempfile

    if os.getuid() != 0:
        pytest.skip("a second user needs root (setuid)")
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody here")
    shards = _shards(bucket)
    shared = tempfile.mkdtemp(prefix="evenshard-test-")  # in /tmp: nobody can reach it
    os.chmod(shared, 0o1777)
    old_umask = os.umask(0o022)
    try:
        with tempfile_dir(shared):
            with _open(shards, [(0, 1)]) as first:
                _read(first, (0, 1))
                mine = os.path.dirname(first.local(0))

        with tempfile_dir(shared):
            assert _as_user(nobody, _second_user_reads, shards, None) == (
                0,
                f"read {shared}/evenshard-cache-{nobody}",
            )
            st = os.stat(f"{shared}/evenshard-cache-{nobody}")
            assert st.st_uid == nobody and stat.S_IMODE(st.st_mode) == 0o700
            code, out = _as_user(nobody, _second_user_reads, shards, mine)
        assert code == 0, out
        assert out.startswith(f"refused cache_dir {mine} (owner uid 0, mode 0o700)"), out
        assert "\n" not in out
    finally:
        os.umask(old_umask)
        shutil.rmtree(shared)


NAMESPACED_READER = """
import hashlib, json, os, sys
from reader.cache.shard_cache import CacheOptions, ShardCache
shards, folder, ready = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
with ShardCache(shards, lambda: iter([(0, 1)]), CacheOptions(folder, 10**6)) as cache:
    paths = cache.enter((0, 1))
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    sys.stdin.readline()  # another reader opens the folder meanwhile
    for path, shard in zip(paths, shards):
        with open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == shard["sha256"], path
print("read")
"""


def _wait_for(path, proc, seconds: float = 60) -> str:
    """The text ``proc`` writes to ``path`` when it is ready (fails if it dies first)."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + seconds
    while not os.path.exists(path) or not Path(path).read_text():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"not ready in {seconds} s"
        time.sleep(0.05)
    return Path(path).read_text()


def test_a_reader_in_another_pid_namespace_is_not_taken_for_dead(bucket, tmp_path):
    """Issue 27: "a PID you cannot see is not a dead one". A reader in another PID
    namespace (a container sharing cache_dir: here `unshare --pid`, its PID one that
    does not exist here) holds links; a reader opening the folder here leaves them, and
    the first reads its shards to the end."""
    import subprocess
    import sys

    if os.getuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a PID namespace needs root and unshare")
    namespaced = ["unshare", "--pid", "--fork", "--mount-proc"]
    if subprocess.run([*namespaced, "true"], capture_output=True).returncode:
        pytest.skip("unshare --pid is not allowed here")
    pid = next(p for p in range(30000, 1 << 22) if not os.path.exists(f"/proc/{p}"))
    shards, folder, ready = _shards(bucket), str(tmp_path / "c"), str(tmp_path / "ready")
    script = f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid; "$@"; exit $?'
    reader = subprocess.Popen(
        [*namespaced, "sh", "-c", script, "sh", sys.executable, "-c", NAMESPACED_READER]
        + [json.dumps(shards), folder, ready],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(ready, reader) == str(pid)  # not a PID of this namespace
        links = sorted(n for n in os.listdir(folder) if n.endswith(".reading"))
        assert len(links) == 2
        with ShardCache(shards, lambda: iter([]), CacheOptions(folder, 10**6)):
            assert sorted(n for n in os.listdir(folder) if n.endswith(".reading")) == links
        out, err = reader.communicate("go\n", timeout=60)
        assert reader.returncode == 0 and out.strip() == "read", err[-3000:]
    finally:
        reader.kill()
        reader.communicate()  # closes its pipes


KILLED_MID_FETCH = """
import json, sys, time
from reader.cache import shard_cache as module
from reader.cache.shard_cache import CacheOptions, ShardCache
shards, folder, ready = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
real = module.storage.download

def stalled(path, out):
    if path != shards[1]["path"]:
        return real(path, out)
    out.write(b"half a shard")
    out.out.flush()
    with open(ready, "w") as f:
        f.write("stalled")
    time.sleep(600)

module.storage.download = stalled
cache = ShardCache(shards, lambda: iter([(0,), (1,)]), CacheOptions(folder, 10**6, in_flight=1))
cache.enter((0,))
time.sleep(600)
"""


def test_what_a_reader_killed_mid_fetch_left_is_swept_and_a_closed_one_leaves_nothing(
    bucket, tmp_path
):
    """Issue 27: a reader killed mid-fetch left its .part (up to a shard, outside any
    limit) and its links forever, and every shard ever read left its .lock. The next
    reader to open the folder sweeps what the dead reader left; a reader that closes
    leaves nothing; a download of a reader that is not provably dead (another PID
    namespace), and files the cache did not make, stay."""
    import signal
    import subprocess
    import sys

    shards, folder, ready = _shards(bucket), tmp_path / "c", str(tmp_path / "ready")
    with ShardCache(shards, lambda: iter([(0, 1), (2, 3)]), CacheOptions(str(folder), 10**6)) as c:
        assert [len(b) for g in [(0, 1), (2, 3)] for b in _read(c, g)] == [3000] * 4
    assert os.listdir(folder) == []  # no lock left either

    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_FETCH, json.dumps(shards), str(folder), ready],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(ready, killed)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.communicate()  # closes its pipes
    left = sorted(os.listdir(folder))
    assert sorted(n.rsplit(".", 1)[-1] for n in left) == [
        *("lock", "lock", "part", "reading", "tfrecord")  # shard 0 read, shard 1 half fetched
    ]
    (copy,) = (n for n in left if n.endswith(".tfrecord"))
    others = [  # a download of a reader in another PID namespace; a file of the user's
        f"{copy}.ffffffffffff-{os.getpid()}-1-0abc.part",
        "notes.txt",
    ]
    for name in others:
        (folder / name).write_bytes(b"x")
    ShardCache(shards, lambda: iter([]), CacheOptions(str(folder), 10**6)).close()
    assert sorted(os.listdir(folder)) == sorted(others)


def test_a_download_never_grows_past_the_listed_size(bucket, tmp_path, monkeypatch):
    """A download counts against cache_limit as its listed size, reserved before its
    .part is made: an object larger than listed (replaced, or hostile: 5 MB where 3,000
    bytes are listed) stops at the listed size, and is named. Before, all of it landed
    in the .part first."""
    from schemas import storage

    (shard,) = _shards(bucket, n=1)
    bucket.put(shard["path"].split("/", 3)[3], b"x" * (5 << 20))
    real, written = storage.download, [0]

    def counted(path, out):
        class Counted:
            def write(self, chunk):
                out.write(chunk)  # raises when the download must stop
                written[0] += len(chunk)

        return real(path, Counted())

    monkeypatch.setattr(storage, "download", counted)
    with ShardCache([shard], lambda: iter([(0,)]), CacheOptions(str(tmp_path), 10**6)) as c:
        with pytest.raises(DatasetError, match="more bytes than the 3,000 listed fetched, twice"):
            c.enter((0,))
    assert written[0] <= 2 * 3000 and os.listdir(tmp_path) == []


def test_a_full_disk_under_the_cache_is_one_line_naming_folder_and_shard(bucket, tmp_path):
    """Issue 27: a full disk gave a bare "[Errno 28] No space left on device" naming
    neither the folder nor the shard. The cache folder on a 64 KiB tmpfs (mounting needs
    root), four shards of 40,000 bytes: one line saying what to do, and no .part left."""
    import subprocess

    small = tmp_path / "small"
    small.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(small)]
    if os.getuid() != 0 or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root and the right to mount")
    try:
        shards = _shards(bucket, size=40000)
        with ShardCache(shards, lambda: iter([(0, 1, 2, 3)]), CacheOptions(str(small), 10**6)) as c:
            with pytest.raises(DatasetError) as e:
                c.enter((0, 1, 2, 3))
        (line,) = str(e.value).splitlines()
        assert line.startswith(f"cache folder {small} is full (No space left on device) fetching ")
        assert "-of-00004.tfrecord (40,000 bytes): free space there, or lower cache_limit" in line
        assert not [n for n in os.listdir(small) if n.endswith(".part")]
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)


def test_the_files_of_a_runs_copy_are_swept_as_a_shards_are(tmp_path):
    """A tight cache keeps runs of shards (``NAME~START-STOP``): a dead reader's link and
    download of one, and then the copy and lock no reader uses, are swept; a run-like
    name the cache does not make stays."""
    from reader.cache.folder import _kind, _namespace, sweep

    copy = f"{'a' * 32}-train-00000-of-00002.tfrecord~3-9"
    assert _kind(copy) == (copy, "", "copy") and _kind(f"{copy}.lock")[2] == "lock"
    dead = f"{_namespace()}-{2**22 + 11}-1"  # this namespace, a PID no process has
    made = [copy, f"{copy}.lock", f"{copy}.{dead}-0abc.reading", f"{copy}.{dead}-0abd.part"]
    for name in made[:3]:
        (tmp_path / name).write_bytes(b"run")
    os.remove(tmp_path / made[2])
    os.link(tmp_path / copy, tmp_path / made[2])  # the dead reader's link to the copy
    (tmp_path / made[3]).write_bytes(b"half")
    theirs = f"{'a' * 32}-notes.txt~3-9"
    (tmp_path / theirs).write_bytes(b"x")
    assert _kind(made[2])[1:] == (dead, "reading") and _kind(theirs)[2] == ""
    sweep(str(tmp_path))
    assert os.listdir(tmp_path) == [theirs]


def test_runs_are_fetched_where_they_download_less_than_whole_shards():
    """Runs download a shuffled read's bytes once an epoch; whole shards once in all when
    the limit holds them, and less than runs when it holds most of them (the eviction
    keeps what the plan needs soonest). So runs below RUNS_BELOW of the bytes, for
    shuffled reads (unshuffled, a run is a whole shard: its sha256 is checked), and
    never without a DALI index (gzip)."""
    from reader.cache.policy import RUNS_BELOW, by_runs

    shards = [{"num_bytes": 100, "table": [[0, 100]]} for _ in range(10)]
    assert by_runs(shards, 100) and by_runs(shards, int(RUNS_BELOW * 1000) - 1)
    assert not by_runs(shards, int(RUNS_BELOW * 1000)) and not by_runs(shards, 1000)
    assert not by_runs(shards, 100, shuffled=False)
    assert not by_runs([*shards, {"num_bytes": 100, "table": None}], 100)


def test_a_reader_entering_a_group_of_a_closed_cache_is_told_not_left_waiting(bucket, tmp_path):
    """A reader that enters a group after the cache closed (a prefetch thread at exit,
    after the atexit close) used to wait forever for a fetch that never comes."""
    import threading

    shards = _shards(bucket)
    cache = ShardCache(shards, lambda: iter([(0,), (1,)]), CacheOptions(str(tmp_path), 10**6))
    cache.enter((0,))
    cache.close()
    raised = []

    def enter():
        try:
            cache.enter((1,))
        except RuntimeError as e:
            raised.append(str(e))

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and raised and "was closed" in raised[0]
