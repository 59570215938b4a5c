"""A bounded local cache of a bucket's shards, fetched ahead in the order the read uses them.

A reader of a gs:// dataset reads local copies of its shards. The read order is
computable (``reader.order.plan``): epoch by epoch, groups of ``cycle_length`` runs, each
run in one shard. So the shards a read needs, and when, are known in advance:
a thread fetches them ahead of the reader, several at once, group after group,
shard by shard as far as ``cache_limit`` allows (what is in flight counts). To
make room it evicts a shard that no group from the reader's to the one being
fetched needs, the one the plan needs again latest first (it looks
``LOOKAHEAD`` groups ahead); when there is none it waits for the reader to
finish its group. It runs at most ``AHEAD`` groups ahead of the reader (a cache
that holds every shard has nothing to fetch, and an endless read never ends). A
reader waits only when it outruns the fetches.

What is fetched depends on the limit: whole shards, or runs of records
(``reader.cache.policy``).

Several processes on one machine (local ranks) share one cache folder: a shard is
fetched under a lock of its own, into a temporary name, checked against the size
and sha256 dataset_info.json lists (fetched again once if it does not match, then
an error naming it), and renamed into place; a rank that finds it in place uses
it. Eviction removes only files of this cache. The limit bounds each reader's own
fetches (downloads in flight included); ranks sharing a folder share the files they
both read. The folder is one only this user can write (``reader.cache.folder``): a copy in
place is used unread. A cache that opens the folder sweeps what readers that provably
died left (links, downloads) and the locks and copies no reader uses (``sweep``).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import errno
import hashlib
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Iterator

from reader.cache import fetch as cache_fetch
from reader.cache.folder import cache_folder, lock_shard, release_shard, sweep, this_owner, unlink
from reader.cache.policy import by_runs, check_limit, keys
from reader.records.record_offsets import span
from schemas import storage
from schemas.errors import OperationError
from schemas.info import SHA256, DatasetError

AHEAD = 64  # groups the fetching may run ahead of the reader, at most
LOOKAHEAD = 64  # groups of the plan beyond those looked at to choose what to evict


@dataclasses.dataclass(frozen=True)
class CacheOptions:
    """``cache_dir``: a local folder for the shards of a gs:// dataset (created; None: the
    default, ``cache_folder`` says which and what is refused); ``cache_limit``: bytes this
    reader keeps there at most; ``in_flight``: fetches at once."""

    cache_dir: str | None
    cache_limit: int
    in_flight: int = 4


def open_cache(read, options) -> ShardCache | None:
    """The cache a worker's read of a bucket goes through; None when its shards are local.

    Args:
        read: a ``reader.front.share.Share`` (its shards, plan and start).
        options: a ``reader.ReadOptions`` (``cache_dir``, ``cache_limit``, ``epochs``).

    Raises:
        ValueError: ``cache_limit`` is smaller than the shards one group of runs may
            read at once (the ``cycle_length`` largest): the reader would wait forever.
    """
    if not storage.is_url(read.shards[0]["path"]):
        return None
    check_limit(read.shards, read.plan.cycle, options.cache_limit)
    by_run = by_runs(read.shards, options.cache_limit, read.plan.seed is not None)

    def groups():
        for runs in read.plan.groups(read.start, options.epochs):
            yield keys(runs.file, runs.start, runs.stop, by_run)

    return ShardCache(
        read.shards, groups, CacheOptions(options.cache_dir, options.cache_limit), by_run
    )


class ShardCache:
    """Local copies of some shards, or of runs of them, fetched ahead along ``groups``
    (see the module docstring).

    Args:
        shards: [{path (a URL), num_bytes, sha256?, table?}], indexed as the groups
            index them (``table``: the DALI index, [[offset, size]], for ``by_run``).
        groups: gives the read's groups in order, each the keys (``keys``) of the runs
            read at once, anew for each pass over the read.
        options: where and how much.
        by_run: keys are runs (shard, start, stop), each fetched as its byte range and
            checked record by record; else shard indices, fetched whole and checked
            against their sha256.

    A limit smaller than a group's shards would wait forever: ``open_cache`` refuses
    it first.
    """

    def __init__(
        self,
        shards: list[dict],
        groups: Callable[[], Iterator],
        options: CacheOptions,
        by_run: bool = False,
    ):
        self.shards, self.options, self.by_run = shards, options, by_run
        self.folder = cache_folder(options.cache_dir)  # only this user can write it
        self._groups = groups
        self._run = 0  # the reader's pass over the read (a new one restarts the fetching)
        self._ahead: list[tuple[int, ...]] = []  # groups fetched or being fetched, in order
        self._held: dict = {}  # key -> bytes of this reader's copy
        self._pending: dict = {}  # key -> bytes, being fetched
        self._lock = threading.Condition()
        self._next = 0  # the group the reader enters next
        self._reading = False  # whether it is inside group _next - 1
        self._error: BaseException | None = None
        self._done = False
        self.fetched = 0  # downloads made by this reader (tests count them)
        self.fetched_bytes = 0  # and their bytes
        self.peak = 0  # the most bytes this reader held at once
        self._owner = this_owner()  # in the names of this reader's links and downloads
        self._id = f"{self._owner}-{uuid.uuid4().hex[:8]}.reading"
        self._names = [self._name(i) for i in range(len(shards))]  # refused here, not later
        sweep(self.folder)
        atexit.register(self.close)
        self._thread = self._start()

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._fetch_ahead, args=(self._run,), daemon=True)
        thread.start()
        return thread

    def _live(self, run: int) -> bool:
        """Whether the fetching of pass ``run`` goes on (not closed, no newer pass)."""
        return not self._done and run == self._run

    def _name(self, index: int) -> str:
        """The shard's file in the cache folder, shared by the readers of the folder: named
        by its content (the listed sha256) or else its URL, so that shards of like names
        from other datasets, or from an earlier conversion of this one, never stand in.

        Raises:
            DatasetError: a sha256 that is not one, or a name that would leave the folder
                (``schemas.info`` refuses both first: this is defence in depth).
        """
        shard = self.shards[index]
        key = shard.get("sha256")
        if key is None:
            key = hashlib.sha256(f"{shard['path']}:{shard['num_bytes']}".encode()).hexdigest()
        if not isinstance(key, str) or not SHA256.fullmatch(key):
            raise DatasetError(
                f"{shard['path']}: sha256 {key!r:.80} is not 64 lowercase hex digits: "
                "it cannot name a copy in the cache (convert again, or restore dataset_info.json)"
            )
        name = f"{key[:32]}-{os.path.basename(shard['path'])}"
        folder = os.path.abspath(self.folder)
        if os.path.dirname(os.path.normpath(os.path.join(folder, name))) != folder:
            raise DatasetError(
                f"{shard['path']}: its copy {name!r} would lie outside the cache folder {folder}"
            )
        return os.path.join(self.folder, name)

    def _shared(self, key) -> str:
        """The file of a shard or run in the cache folder (``_name``, and a run's records
        after a ``~``; every other file of it, the lock, the downloads and the links, is
        this path and a suffix)."""
        if isinstance(key, int):
            return self._names[key]
        return f"{self._names[key[0]]}~{key[1]}-{key[2]}"

    def local(self, key) -> str:
        """This reader's path of a shard or run: a hard link to the shared file, so that
        another reader evicting it never removes a file this one reads."""
        return f"{self._shared(key)}.{self._id}"

    def _shard(self, key) -> dict:
        """The shard of a key: a shard index, or a run (shard, start, stop)."""
        return self.shards[key if isinstance(key, int) else key[0]]

    def _size(self, key) -> int:
        if isinstance(key, int):
            return self.shards[key]["num_bytes"]
        return span(self._shard(key)["table"], key[1], key[2])[1]

    def runs(self, files, starts, stops, first: bool = False) -> tuple:
        """``enter`` for a reader of runs: a group's runs by their columns; returns for
        each run its local path, the record it holds first, its bytes and its records
        (a whole shard's copy: 0, the listed size and count; a run's: its own)."""
        group = keys(files, starts, stops, self.by_run)
        paths = self.enter(group, first)
        if not self.by_run:
            shards = [self.shards[i] for i in group]
            return (
                paths,
                [0] * len(group),
                *zip(*((s["num_bytes"], s["num_examples"]) for s in shards)),
            )
        return paths, list(starts), [self._size(k) for k in group], [k[2] - k[1] for k in group]

    def enter(self, group, first: bool = False) -> list[str]:
        """The reader is done with its group and starts the next: waits until that
        group's shards are local; returns their paths. Groups are entered in order;
        ``first``: the read's first group, where a new pass over the read starts (a
        tf.data dataset is iterated again each Keras epoch: the fetching starts over,
        keeping the copies it holds)."""
        group = tuple(group)
        if first and self._next:  # the reader entered groups of an earlier pass
            self._restart()
        with self._lock:
            self._reading = False
            self._lock.notify_all()
            while True:
                if self._error is not None:
                    raise self._error
                if self._done:  # closed (a reader left at exit): nothing more comes
                    raise OperationError(f"the bucket cache in {self.folder} was closed")
                if self._next < len(self._ahead) and all(
                    i in self._held for i in self._ahead[self._next]
                ):
                    if self._ahead[self._next] != group:
                        raise OperationError("the cache's groups and the reader's differ")
                    self._next += 1
                    self._lock.notify_all()  # the fetching may be waiting to run further
                    self._reading = True
                    return [self.local(i) for i in group]
                self._lock.wait(0.5)

    def __enter__(self) -> ShardCache:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _restart(self) -> None:
        with self._lock:
            self._run += 1
            self._lock.notify_all()
        self._thread.join()  # what it has in flight lands among the held copies
        with self._lock:
            self._ahead, self._next, self._reading = [], 0, False
        self._thread = self._start()

    def close(self) -> None:
        """Stops fetching and drops this reader's links (shared files no reader links go)."""
        with self._lock:
            self._done = True
            self._lock.notify_all()
        self._thread.join(timeout=60)
        with self._lock:
            for index in list(self._held):
                self._evict(index)

    def _fetch_ahead(self, run: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        try:  # any error, the plan's too, is the reader's
            groups = iter(self._groups())
            future = collections.deque(itertools.islice(groups, LOOKAHEAD))
            with ThreadPoolExecutor(self.options.in_flight) as pool:
                while future:
                    group = tuple(future.popleft())
                    future.extend(itertools.islice(groups, 1))
                    with self._lock:
                        # at most AHEAD groups ahead of the reader: a cache that holds
                        # every shard of an endless read has nothing to fetch, and would
                        # walk the plan forever
                        while len(self._ahead) - self._next >= AHEAD and self._live(run):
                            self._lock.wait(0.5)
                        if not self._live(run):
                            return
                        behind = self._next - 1  # groups the reader has left
                        if behind >= AHEAD:
                            del self._ahead[:behind]
                            self._next -= behind
                        self._ahead.append(group)
                        fetching = len(self._ahead) - 1
                        missing = [
                            i
                            for i in dict.fromkeys(group)
                            if i not in self._held and i not in self._pending
                        ]
                    # shard by shard, as room is made: fetches overlap the reader's group
                    for i in missing:
                        if not self._make_room(i, fetching, future, run):
                            return
                        pool.submit(self._fetch, i).add_done_callback(self._failed)
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self._fail(e)

    def _failed(self, done) -> None:
        if done.exception() is not None:
            self._fail(done.exception())

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self._error = self._error or error
            self._done = True
            self._lock.notify_all()

    def _make_room(self, index, fetching: int, future, run: int) -> bool:
        """Waits until shard or run ``index`` fits beside what is held and in flight,
        evicting those no group from the reader's to the one being fetched needs, the
        one needed again latest first (the plan says when: ``future`` holds the next
        groups; a run is never needed again); reserves its bytes. False: closed, or a
        new pass began."""
        size = self._size(index)
        with self._lock:
            while self._live(run):
                if sum(self._held.values()) + sum(self._pending.values()) + size <= (
                    self.options.cache_limit
                ):
                    self._pending[index] = size
                    return True
                first = self._next - 1 if self._reading else self._next
                needed = {i for g in self._ahead[max(first, 0) : fetching + 1] for i in g}
                idle = [i for i in self._held if i not in needed]
                if idle:
                    next_use = {}
                    for k, g in enumerate(future):
                        for i in g:
                            next_use.setdefault(i, k)
                    self._evict(max(idle, key=lambda i: next_use.get(i, len(future))))
                else:
                    self._lock.wait(0.5)  # the reader must finish its group first
            return False

    def _evict(self, index) -> None:
        """Drops this reader's link; the shared file goes with the last reader's."""
        self._held.pop(index)
        unlink(self.local(index), self._shared(index))

    def _fetch(self, index) -> None:
        try:
            self._fetch_locked(index)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            shard = self._shard(index)
            raise DatasetError(
                f"cache folder {self.folder} is full ({e.strerror}) fetching {shard['path']} "
                f"({self._size(index):,} bytes): free space there, or lower cache_limit, "
                "or pass a cache_dir on a disk with room"
            ) from None
        with self._lock:
            self._held[index] = self._pending.pop(index)
            self.peak = max(self.peak, sum(self._held.values()))
            self._lock.notify_all()

    def _fetch_locked(self, index) -> None:
        """Shard or run ``index`` in place, and this reader's link to it, under its lock."""
        path = self._shared(index)
        shard = self._shard(index)
        lock = lock_shard(path)  # one reader fetches; the others find it
        try:
            if not (os.path.exists(path) and os.path.getsize(path) == self._size(index)):
                for attempt in (1, 2):
                    problem = self._download(index, path)
                    if problem is None:
                        break
                    if attempt == 2:
                        raise DatasetError(
                            f"{shard['path']}: {problem}, twice: the object in the bucket "
                            "does not match dataset_info.json (convert again, or restore it)"
                        )
            if not os.path.exists(self.local(index)):
                os.link(path, self.local(index))
        finally:
            release_shard(lock, path)

    def _download(self, index, path: str) -> str | None:
        """Fetches into a temporary name and renames into place; None, or what was wrong."""
        tmp = f"{path}.{self._owner}-{uuid.uuid4().hex[:8]}.part"  # swept if this reader dies
        try:
            with open(tmp, "wb") as out:
                if isinstance(index, int):
                    problem = cache_fetch.whole(self.shards[index], out, self._count)
                else:
                    shard, start, stop = index
                    problem = cache_fetch.ranged(self.shards[shard], start, stop, out, self._count)
            if problem is None:
                os.replace(tmp, path)
            return problem
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def _count(self, size: int) -> None:
        with self._lock:
            self.fetched += 1
            self.fetched_bytes += size
