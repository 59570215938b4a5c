"""The cache folder: whose it is, who of its readers is alive, and the shard locks.

A bucket's shard copies (``shard_cache``) live in a folder only this user can write
(``cache_folder``), so a copy found in place is used unread. Readers sharing the folder
name their links and downloads after themselves (``this_owner``: the machine's boot,
the PID namespace, the PID and its start), so a cache opening the folder removes what
provably dead readers left (``sweep``) and never what a live one in another container
holds. A shard's file is created, linked and removed under its lock (``lock_shard``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat

from schemas import layout
from schemas.info import DatasetError

_COPY = re.compile(r"[0-9a-f]{32}-(.+)")  # a copy's name: its key, its shard's file name
_RUN = re.compile(r"~[0-9]+-[0-9]+$")  # after it, a run's records


def default_cache_dir() -> str:
    """Where a reader without ``cache_dir`` keeps a bucket's shards: a folder of this
    user's in the machine's temp folder, ``evenshard-cache-<uid>``, so that the user's
    local ranks share it and no other user's files stand in for copies."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"evenshard-cache-{os.getuid()}")


def cache_folder(cache_dir: str | None) -> str:
    """The folder the copies go in: one that only this user can write. A copy found there
    of the listed size is used unread: only a reader of this user, having checked its
    sha256, renamed it into place (its name is the mark of that check).

    Without ``cache_dir``: ``default_cache_dir()``, created 0700; it must be a folder (not
    a link) of this user's that group and others cannot write. A given ``cache_dir`` is
    created 0700 when missing and used as it is when it is this user's and group and
    others cannot write it. One shared safely (of this user or root, sticky where others
    may write, as /tmp is) gets a folder of this user's inside, ``evenshard-<uid>``,
    checked as the default is.

    Raises:
        DatasetError: another user could write the folder, or this user cannot; the
            message says what to do.
    """
    if cache_dir is None:
        return _own_folder(default_cache_dir(), "the default cache folder", "pass cache_dir")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(cache_dir)), exist_ok=True)
        os.mkdir(cache_dir, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DatasetError(
            f"cache_dir {cache_dir} cannot be made ({e.strerror}): pass a folder you can write"
        ) from None
    st = os.stat(cache_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise DatasetError(f"cache_dir {cache_dir} is not a folder: pass a folder")
    if st.st_uid == os.getuid() and not st.st_mode & 0o022:
        return cache_dir
    shared_safely = st.st_uid in (os.getuid(), 0) and (
        not st.st_mode & 0o022 or st.st_mode & stat.S_ISVTX
    )
    if shared_safely and os.access(cache_dir, os.W_OK | os.X_OK):
        return _own_folder(
            os.path.join(cache_dir, f"evenshard-{os.getuid()}"), "cache folder", "pass cache_dir"
        )
    raise DatasetError(
        f"cache_dir {cache_dir} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):#o}) "
        "is not a folder only you can write: other users could put files in place of "
        "copies there, or you cannot write it; pass a folder of your own (it is created)"
    )


def _own_folder(path: str, what: str, fix: str) -> str:
    """``path``, created 0700 when missing; refused unless it is a folder (not a link) of
    this user's that group and others cannot write."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DatasetError(f"{what} {path} cannot be made ({e.strerror}): {fix}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        problem = "not a folder"
    elif st.st_uid != os.getuid():
        problem = f"owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    else:
        return path
    raise DatasetError(
        f"{what} {path} is {problem}: another user may have put files there in place of "
        f"shards; remove it (it is made again, 0700), or {fix}"
    )


def sweep(folder: str) -> None:
    """What readers that died (killed before closing) left in the cache folder, their
    links and downloads (``.part``), and the shard files no reader uses: a copy no reader
    links, a lock beside no copy. A reader's file goes only when the reader is provably
    dead (``dead``); a copy or a lock only when found unused under the shard's lock (no
    reader is fetching or linking it meanwhile), never waiting for it. Only names the
    cache makes are looked at: the folder may hold other files. So a folder does not
    grow from run to run."""
    names = [(name, _kind(name)) for name in os.listdir(folder)]
    for name, (copy, owner, kind) in names:
        if kind in ("reading", "part") and dead(owner):
            if kind == "reading":
                unlink(os.path.join(folder, name), os.path.join(folder, copy))
            else:  # its reader held the lock, and died: nothing else writes it
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, name))
    for copy in dict.fromkeys(copy for _, (copy, _, kind) in names if kind in ("copy", "lock")):
        lock = lock_shard(os.path.join(folder, copy), wait=False)
        if lock is not None:
            release_shard(lock, os.path.join(folder, copy), unused=True)


def _kind(name: str) -> tuple[str, str, str]:
    """(copy, owner, kind) of a name in the cache folder: kind "copy" (a shard's shared
    file), "lock", "reading" (a reader's link), "part" (a download) or "" (not a name the
    cache makes); owner: ``this_owner`` of a link's or download's reader."""
    copy, owner, kind = name, "", "copy"
    if name.endswith(".lock"):
        copy, kind = name[: -len(".lock")], "lock"
    elif name.endswith((".reading", ".part")):
        copy, tag, kind = name.rsplit(".", 2)
        owner = tag.rsplit("-", 1)[0]
    match = _COPY.fullmatch(_RUN.sub("", copy))  # a run's copy: its shard's name, ~START-STOP
    return copy, owner, kind if match and layout.is_shard_name(match[1]) else ""


def this_owner() -> str:
    """Who makes a file of the cache folder, in its name: ``NS-PID-START``, NS naming this
    machine's boot and this process's PID namespace, START the process's start (so that
    a PID used again is not taken for its old owner)."""
    ns = _namespace()  # None: /proc was read above, this process's stat reads too
    return f"{ns or 'unknown'}-{os.getpid()}-{_started(os.getpid()) if ns else 0}"


def dead(owner: str) -> bool:
    """Whether the process that wrote ``owner`` (``this_owner``) is provably gone: it ran in
    this boot of this machine and in this PID namespace, and its PID is gone or started
    at another time. A PID this process cannot see is not a dead one: a reader in another
    container sharing the folder, or on another machine, or named by an older version of
    evenshard, is alive."""
    try:
        ns, pid, start = owner.split("-")
        return ns == _namespace() is not None and _started(int(pid)) != start
    except (ValueError, OSError):  # not a name of ours; a process we may not look at
        return False


def _namespace() -> str | None:
    """This machine's boot and this process's PID namespace, hashed; None when /proc
    cannot say (then no process is ever taken for dead)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        ns = os.readlink("/proc/self/ns/pid")
        if int(os.readlink("/proc/self")) != os.getpid():
            return None  # a /proc of another PID namespace: its PIDs are not ours
    except (OSError, ValueError):
        return None
    return hashlib.sha256(f"{boot}:{ns}".encode()).hexdigest()[:12]


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, /proc/PID/stat's 22nd
    field); None when there is no such process.

    Raises:
        OSError: /proc says no more (not ours to read, say).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except FileNotFoundError:
        return None
    fields = stat_line.rsplit(b")", 1)[-1].split()  # after the command, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


def unlink(link: str, shared: str) -> None:
    """Drops a reader's link, and the shared file with the last link, under the shard's
    lock (a reader fetching it meanwhile finds it whole or not at all)."""
    lock = lock_shard(shared)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.remove(link)
            if os.stat(shared).st_nlink == 1:
                os.remove(shared)
    finally:
        release_shard(lock, shared)


def lock_shard(shared: str, wait: bool = True) -> int | None:
    """Takes the lock of shard file ``shared`` (``flock`` on ``shared.lock``, made when
    missing); returns its descriptor, or None when ``wait`` is False and another reader
    holds it. The lock file goes when the shard's file does (``release_shard``): a reader
    that locked a file no longer at that name locks the one there now."""
    name = shared + ".lock"
    while True:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.stat(name), os.fstat(fd)):
                    return fd
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed by the reader that held it: lock the one there now


def release_shard(lock: int, shared: str, unused: bool = False) -> None:
    """Unlocks the shard's lock (``lock_shard``), removing the lock file when the shard has no
    file; ``unused``: removing first the shard's file when no reader links it."""
    try:
        try:
            if unused and os.stat(shared).st_nlink == 1:
                os.remove(shared)
            gone = not os.path.exists(shared)
        except FileNotFoundError:
            gone = True
        if gone:
            with contextlib.suppress(FileNotFoundError):
                os.remove(shared + ".lock")  # held: no reader removes or locks it meanwhile
    finally:
        os.close(lock)
