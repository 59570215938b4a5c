"""Python preprocessing in worker processes: each image decoded once, a user's transform
run on it (once a view), the batches back in read order through shared memory.

The order is computed before preprocessing (``reader.source``); the pool maps the
numbered batches and they come back by number, so the output order is the read order
for any number of processes. Every random choice a transform makes draws from the rng
``example_rng(seed, key, epoch, view)`` gives (the order's keyed hash, purpose
``AUGMENT``), never from a process's own state: so the output is byte-identical for any
number of processes, after a resume at any step and after an elastic resize, and a
``ReadState`` needs nothing new.

Processes start with forkserver (spawn where there is none): a TensorFlow runtime
cannot be forked. A batch's arrays of one shape are stacked by the process into one
shared memory block a field, which the reader copies out and unlinks; other values
(strings, dicts, arrays of other shapes) come pickled, as lists.

The processes end with the read, however it ends, whatever their transform is doing:
each watches a pipe only the reader holds (``_watch``), whose end (the read left early,
the reader's process killed) ends it, its blocks unlinked; Ctrl-C ends it too
(``_interrupt``), the reader raising it where it waits. The fork server and the
resource tracker end once no process of theirs is left. The blocks are named after the
reader's process (``cache_folder.this_owner``), so a reader starting removes those of
readers that died all at once (``_sweep``).
"""

from __future__ import annotations

import atexit
import collections
import collections.abc
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import os
import pickle
import re
import signal
import threading
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import shared_memory

import numpy as np

from reader import compat_mp, pixels
from reader.cache_folder import dead, this_owner
from reader.order.draws import AUGMENT, draws, key_digest
from schemas.errors import Error


class TransformError(Error, RuntimeError):
    """A user's transform failed: one line naming the function and the example."""


def example_rng(seed: int, key: str, epoch: int, view: int) -> np.random.Generator:
    """The rng of one view of one example in one epoch: the same on every machine, in
    every process, after any resume."""
    word = int(draws(1, seed, AUGMENT, key_digest(key), epoch, view)[0])
    return np.random.Generator(np.random.PCG64(word))


def check_transform(transform) -> bytes:
    """The transform, pickled for the worker processes; refused now when it cannot be
    (a lambda, a local function), not in a process later."""
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be a function fn(example, rng) -> dict, got {transform!r}")
    try:
        return pickle.dumps(transform)
    except Exception as e:  # noqa: BLE001 - pickling can fail in many ways
        raise TypeError(
            f"transform {getattr(transform, '__qualname__', transform)!r} cannot be sent to "
            f"worker processes ({type(e).__name__}: {e}): define it at the top level of a "
            "module (not a lambda or a local function), or pass num_processes=0"
        ) from None


class Preprocess:
    """Maps batches of encoded images through decode and the transform, in ``processes``
    worker processes (0: in this process), keeping their order.

    Args:
        transform: ``fn(example, rng) -> dict`` or None (decode only).
        processes: worker processes; 0 runs everything here.
        channels: 1, 3 or 4.
        image_size: (height, width) each decoded view is resized to before
            ``transform`` sees it (its output goes out as it is), or None.
        seed: the read's seed (the rngs derive from it).
        views: transforms of each decoded image.
        augment: ``ReadOptions.augment()``: each view cropped and flipped as every
            reader does (``reader/order/augment.py``) and resized to ``image_size``,
            before ``transform`` sees it.
    """

    def __init__(
        self, transform, processes: int, channels, image_size, seed, views=1, augment=None
    ):
        self.transform = transform
        self.config = (channels, image_size, seed, views, augment)
        self.processes = processes
        self.decoded = 0  # images decoded (tests count them: one a record, whatever views)
        self.first = None  # the first batch's fields, and its first key

    def map(self, batches):
        """Outputs of ``batches`` (``reader.source.Batch``), in order: dicts of stacked
        arrays or lists, with ``key``, ``view``, ``epoch``, ``mask``."""
        _sweep()
        blocks = _Blocks()
        if self.processes == 0:  # this read's own state: another read may run beside it
            worker = {"transform": self.transform, "config": self.config, "blocks": {}}
            worker["prefix"] = blocks.prefix
            try:
                for batch in batches:
                    yield self._collect(_run(_task(batch), blocks.lend(), worker), blocks)
            finally:
                blocks.unlink()
                for memory in worker["blocks"].values():  # this read's maps
                    memory.close()
            return
        context = _context()
        held, lifeline = context.Pipe()  # ``held``: this process's alone (``_watch``)
        payload = check_transform(self.transform)
        pool = concurrent.futures.ProcessPoolExecutor(
            self.processes,
            context,
            initializer=_init,
            initargs=(payload, _name(self.transform), self.config, blocks.prefix, lifeline),
        )
        pending: collections.deque = collections.deque()
        finished = False
        atexit.register(blocks.unlink)  # a read never finished (tf.data's, at Ctrl-C)
        try:
            for number, batch in enumerate(batches):
                try:
                    future = pool.submit(_work, _task(batch), blocks.lend())
                    pending.append((number, future))
                except BrokenProcessPool:  # a process died before its batch was asked for
                    _broken(pending[0][0] if pending else number, held)
                if len(pending) >= 2 * self.processes:  # bounded: 2 batches a process
                    yield self._collect(_result(*pending.popleft(), held), blocks)
            while pending:
                yield self._collect(_result(*pending.popleft(), held), blocks)
            finished = True
        finally:  # left early (Ctrl-C, an error, a break): the processes end now, unwaited
            if not finished:
                held.close()
            pool.shutdown(wait=True, cancel_futures=True)
            held.close()
            lifeline.close()
            for _, future in pending:  # blocks handed over but never read
                if future.done() and not future.cancelled() and future.exception() is None:
                    blocks.known.add(future.result()["block"])
            blocks.unlink()
            atexit.unregister(blocks.unlink)

    def _collect(self, done: dict, blocks: _Blocks) -> dict:
        self.decoded += done.pop("decoded")
        out = dict(done.pop("lists"))
        memory = blocks.attach(done["block"], done["dropped"])
        for name, (offset, shape, dtype) in done.pop("arrays").items():
            out[name] = np.ndarray(shape, dtype, memory.buf, offset).copy()
        blocks.free.append(done["block"])  # copied out: a later batch may reuse it
        if self.first is None:
            self.first = {**dict.fromkeys(out), "key": out["key"][0]}
        elif out.keys() != self.first.keys():  # every batch has the first one's fields
            raise _fields_differ(self.transform, self.first, out["key"][0], out)
        return out


class _Blocks:
    """The shared memory blocks of a read, reused: a batch's arrays come in one block,
    which the reader copies out and lends, with a later task, to whichever process takes
    it (a new block costs its pages' first touch: 17 times the copy into a used one).
    The reader unlinks them all when the read ends (``prefix``: the start of their
    names, None where shared memory is not a folder; ``_sweep``)."""

    def __init__(self):
        self.prefix = f"evenshard-{this_owner()}-{next(_READS)}-" if _NAMED else None
        self.free: list[str] = []  # copied out, ready for another batch
        self.known: set[str] = set()  # every block this read has seen: unlinked at its end
        self.mapped: dict[str, shared_memory.SharedMemory] = {}

    def lend(self) -> str | None:
        return self.free.pop() if self.free else None

    def attach(self, name: str, dropped: str | None) -> shared_memory.SharedMemory:
        if dropped is not None:  # lent, but too small: unlinked by the process
            self.known.discard(dropped)
            old = self.mapped.pop(dropped, None)
            if old is not None:
                old.close()
        self.known.add(name)
        if name not in self.mapped:
            self.mapped[name] = shared_memory.SharedMemory(name)
        return self.mapped[name]

    def unlink(self) -> None:
        """Every block of the read: those it knows, and those a process made and never
        handed over (ended meanwhile)."""
        made = _listed(self.prefix) if self.prefix else []
        for name in self.known.union(made):
            _unlink(name, self.mapped.pop(name, None))
        for memory in self.mapped.values():
            memory.close()
        self.known.clear()
        self.free.clear()


_SHM = "/dev/shm"  # where Linux keeps the blocks, by name
_NAMED = os.path.isdir(_SHM)
_READS = itertools.count()  # the reads of this process (their blocks' names)
_OWNER = re.compile(r"evenshard-([0-9a-f]{12}-[0-9]+-[0-9]+)-")  # ``this_owner`` of a name


def _listed(start: str) -> list[str]:
    """The blocks whose names begin with ``start``."""
    try:
        return [name for name in os.listdir(_SHM) if name.startswith(start)]
    except OSError:
        return []


def _unlink(name: str, memory: shared_memory.SharedMemory | None = None) -> None:
    """Unlinks block ``name`` (``memory``: this process's map of it) when still there."""
    try:
        memory = memory or shared_memory.SharedMemory(name)
    except FileNotFoundError:
        return
    except ValueError:  # made but not yet sized by a process that ended: it cannot be mapped
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_SHM, name))
        return
    memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()


def _sweep() -> None:
    """Removes the blocks of readers whose processes died all at once (kill -9 of a
    process group, a container's end): none was left to unlink them. A block is
    removed only when its reader is provably dead (``cache_folder.dead``)."""
    for name in _listed("evenshard-"):
        owner = _OWNER.match(name)
        if owner and dead(owner[1]):
            _unlink(name)


# imported once by the fork server, not by every process of every read (0.4 s -> 0.1 s a
# pool); none of them imports TensorFlow
_PRELOAD = ("reader.preprocess", "numpy", "cv2", "simplejpeg", "PIL.Image", "PIL.PngImagePlugin")


def _context():
    """Forkserver (a TensorFlow runtime cannot be forked; spawn where there is none),
    its server preloading what the processes import, beside what it preloads already."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    preload = compat_mp.forkserver_preload()
    context.set_forkserver_preload(preload + [m for m in _PRELOAD if m not in preload])
    return context


def _result(number: int, future, held):
    try:
        return future.result()
    except BrokenProcessPool:
        _broken(number, held)


def _broken(number: int, held):
    """A process of the pool ended: Ctrl-C (the processes said so on ``held``: raised
    here, where tf.data waits, as the caller's Ctrl-C is not), or it died."""
    if held.poll():
        raise KeyboardInterrupt from None
    _died(number)


def _died(number: int):
    raise RuntimeError(
        f"a preprocessing process died while batch {number} of this read was "
        "transformed (killed? out of memory? interrupted? or a script that iterates without "
        "'if __name__ == \"__main__\":', which worker processes need, as "
        "PyTorch's DataLoader workers do): the read stops here"
    ) from None


def _task(batch) -> tuple:
    return (
        [bytes(e) for e in batch.encoded],
        batch.label.tolist(),
        list(batch.key),
        batch.epoch.tolist(),
        batch.mask.tolist(),
    )


_WORKER: dict = {"blocks": {}}  # a worker process's transform, config and mapped blocks


def _init(payload: bytes, name: str, config: tuple, prefix: str | None, lifeline) -> None:
    """A worker process's start: it ends when ``lifeline`` does (``_watch``) or Ctrl-C
    comes (``_interrupt``); a transform that cannot be rebuilt here is said by its
    first batch."""
    signal.signal(signal.SIGINT, _interrupt)
    threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
    _WORKER.update(name=name, config=config, prefix=prefix, lifeline=lifeline, process=True)
    try:
        _WORKER["transform"] = pickle.loads(payload)
    except BaseException as e:  # noqa: BLE001 - unpickling runs the user's code
        _WORKER["broken"] = f"{type(e).__name__}: {e}".replace("\n", " ")


_LEAVING = threading.Lock()  # held by the process ending (``_watch``, ``_interrupt``)


def _watch(lifeline) -> None:
    """Ends this process, its blocks unlinked, once the reader's end of ``lifeline``
    closes: the read ended or was left, or the reader's process died (kill -9: a
    process waiting for work would wait forever, holding the fork server and the
    resource tracker)."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    with _LEAVING:
        for memory in list(_WORKER["blocks"].values()):
            with contextlib.suppress(OSError):
                memory.unlink()
        os._exit(0)


def _interrupt(signum, frame) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) in a worker: it says so to the
    reader (``_broken``) and ends at once, whatever its transform is doing (the read is
    over: nothing left to wait for)."""
    with contextlib.suppress(OSError):
        _WORKER["lifeline"].send_bytes(b"Ctrl-C")
    with _LEAVING:  # not between a block's unlink and its word to the resource tracker
        os._exit(0)  # the reader unlinks the blocks


def _work(task: tuple, spare: str | None) -> dict:
    """``_run`` in a worker process."""
    if "broken" in _WORKER:
        raise TransformError(
            f"transform {_WORKER['name']} cannot be rebuilt in a worker process "
            f"({_WORKER['broken']}): define it at the top level of a module the script "
            "imports, or pass num_processes=0"
        )
    return _run(task, spare)


def _run(task: tuple, spare: str | None = None, worker: dict | None = None) -> dict:
    """One batch in a worker (``worker``: the transform, config and mapped blocks; a
    process's own by default): each image decoded once, each view transformed; the
    arrays go into ``spare`` (a block the reader has copied out) when it is large
    enough."""
    worker = _WORKER if worker is None else worker
    transform = worker["transform"]
    channels, image_size, seed, views, augment = worker["config"]
    rows = []
    for chunk in range(0, len(task[0]), _CHUNK):
        part = [column[chunk : chunk + _CHUNK] for column in task]
        images = [pixels.decode(encoded, channels) for encoded in part[0]]
        boxes = None
        if augment is not None:  # one call for the chunk's views (a call costs ~0.3 ms)
            keys, epochs = part[2], part[3]
            boxes = augment.boxes(
                seed,
                [k for k in keys for _ in range(views)],
                [e for e in epochs for _ in range(views)],
                list(range(views)) * len(keys),
                [i.shape[0] for i in images for _ in range(views)],
                [i.shape[1] for i in images for _ in range(views)],
            )
        for i, (image, label, key, epoch, real) in enumerate(zip(images, *part[1:])):
            for view in range(views):
                if boxes is not None:
                    seen = pixels.crop_resize(image, boxes[i * views + view], image_size)
                elif image_size is not None:
                    seen = pixels.resize(image, image_size)
                else:
                    seen = image
                if views > 1 and np.may_share_memory(seen, image):
                    seen = seen.copy()  # each view its own pixels: a transform may write
                example = dict(image=seen, label=label, key=key, epoch=epoch, view=view)
                if transform is not None:
                    example = _transformed(transform, example, seed)
                example["mask"] = real
                example.setdefault("epoch", epoch)
                if rows and example.keys() != rows[0].keys():
                    raise _fields_differ(transform, rows[0], example["key"], example)
                rows.append(example)
    return {**_stack(rows, spare, worker), "decoded": len(task[0])}


_CHUNK = 16  # images decoded at a time: their boxes drawn in one call, memory bounded


def _transformed(transform, example: dict, seed: int) -> dict:
    """The user's transform of one view, with its rng; its failure in one line."""
    key, epoch, view = example["key"], example["epoch"], example["view"]
    try:
        out = transform(example, example_rng(seed, key, epoch, view))
    except BaseException as e:  # noqa: BLE001 - the user's code (sys.exit too): one line
        if isinstance(e, KeyboardInterrupt) and not _WORKER.get("process"):
            raise  # Ctrl-C, in the reader's process (num_processes=0)
        raise TransformError(
            f"transform {_name(transform)} failed on key {key!r} (epoch {epoch}, view {view}): "
            f"{type(e).__name__}: {_said(e)}".replace("\n", " ")
        ) from None
    if not isinstance(out, collections.abc.Mapping):
        raise TransformError(
            f"transform {_name(transform)} returned {type(out).__name__} on key {key!r} "
            f"(epoch {epoch}, view {view}), not a dict: return the example's fields, "
            "e.g. {**example, 'image': image}"
        )
    out = dict(out)
    out.setdefault("key", key)
    out.setdefault("view", view)
    return out


def _said(error: BaseException) -> str:
    """An exception's message, or that it has none to give (its ``__str__`` failed)."""
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - the user's class
        return "(its message could not be made)"


def _fields_differ(transform, first: dict, key, fields) -> TransformError:
    """A field returned for some examples only (the first of a batch or read with
    ``first``'s fields, ``key`` with ``fields``): it would be dropped or misplaced."""
    field = sorted(first.keys() ^ fields.keys())[0]
    keys = (first["key"], key) if field in first else (key, first["key"])
    name = getattr(transform, "__qualname__", repr(transform))
    return TransformError(
        f"transform {name} returned {field!r} for key {keys[0]!r} but not for key "
        f"{keys[1]!r}: return the same fields for every example (None where one has "
        "no value)"
    )


def _stack(rows: list[dict], spare: str | None, worker: dict) -> dict:
    """Fields whose values are arrays of one shape and dtype (or numbers) go stacked into
    one shared memory block (``spare`` when it is large enough); the others as lists,
    which must pickle (checked here: a block handed back unread would be left behind)."""
    stacked, lists = {}, {}
    for name in rows[0]:
        values = [row.get(name) for row in rows]
        if all(isinstance(v, (bool, int, float, np.number, np.ndarray)) for v in values):
            arrays = [np.asarray(v) for v in values]
            if all(a.dtype != object for a in arrays):
                if len({(a.shape, a.dtype.str) for a in arrays}) == 1:
                    stacked[name] = arrays
                    continue
                if not any(isinstance(v, np.ndarray) for v in values):
                    # numbers of several types (1 and 0.5): stacked at their common type
                    common = np.result_type(*arrays)
                    stacked[name] = [a.astype(common) for a in arrays]
                    continue
        lists[name] = values  # as the transform returned them
    try:  # what surely pickles is not tried: an image's pickling copies its every byte
        pickle.dumps({n: [v for v in vs if not _pickles(v)] for n, vs in lists.items()})
    except Exception as e:  # noqa: BLE001 - pickling fails in many ways
        raise TransformError(
            f"the transform's output cannot be sent back from its process "
            f"({type(e).__name__}: {e}): return arrays, numbers, strings and the like"
        ) from None
    arrays, size = {}, 0
    for name, values in stacked.items():
        shape, dtype = (len(values), *values[0].shape), values[0].dtype
        arrays[name] = (size, shape, dtype.str)
        size += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64  # 64-byte aligned
    block, dropped = _block(spare, size, worker)
    for name, values in stacked.items():
        offset, shape, dtype = arrays[name]
        out = np.ndarray(shape, dtype, block.buf, offset)
        for i, value in enumerate(values):  # one copy: straight into the block
            out[i] = value
        del out  # the block closes only once no array views it
    return {"block": block.name, "dropped": dropped, "arrays": arrays, "lists": lists}


def _pickles(value) -> bool:
    """Whether ``value`` pickles for sure: None, a number, a string, bytes, an array of
    numbers (exact types: a subclass may hold what does not pickle)."""
    if type(value) is np.ndarray:
        return not value.dtype.hasobject
    return (
        value is None
        or type(value) in (bool, int, float, str, bytes)
        or (isinstance(value, np.generic) and type(value).__module__ == "numpy")
    )


def _block(
    spare: str | None, size: int, worker: dict
) -> tuple[shared_memory.SharedMemory, str | None]:
    """(a block of at least ``size`` bytes, the name of ``spare`` when it was too small
    and is unlinked here). Blocks stay mapped (``worker["blocks"]``) for the next batch;
    a new one is named after the read (``worker["prefix"]``) and this process."""
    mapped, dropped = worker["blocks"], None
    if spare is not None:
        memory = mapped.get(spare) or shared_memory.SharedMemory(spare)
        if memory.size >= size:
            mapped[spare] = memory
            return memory, None
        mapped.pop(spare, None)
        memory.close()
        memory.unlink()
        dropped = spare
    prefix = worker["prefix"]
    name = None if prefix is None else f"{prefix}{os.getpid()}-{next(_BLOCKS)}"
    memory = shared_memory.SharedMemory(name, create=True, size=max(size, 1))
    mapped[memory.name] = memory
    return memory, dropped


_BLOCKS = itertools.count()  # the blocks this process made (their names)


def _name(transform) -> str:
    """A transform's name in a message: a function's, or a callable object's class."""
    return getattr(transform, "__qualname__", None) or type(transform).__qualname__


def default_processes() -> int:
    """Worker processes by default: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
