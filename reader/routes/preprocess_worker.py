"""A worker process of the Python route (``reader.routes.preprocess``): each image of a batch
decoded once, each view transformed with its own rng, the arrays stacked into a shared
memory block (``reader.routes.shared_blocks``), the rest pickled.

The process ends with the read, however it ends, whatever its transform is doing: it
watches a pipe only the reader holds (``_watch``), whose end (the read left early, the
reader's process killed) ends it, its blocks unlinked; Ctrl-C ends it too
(``_interrupt``), the reader raising it where it waits. ``run`` is the same work in
the reader's own process (``num_processes=0``).
"""

from __future__ import annotations

import collections.abc
import contextlib
import math
import os
import pickle
import re
import signal
import threading

import numpy as np

from reader.decode import pixels
from reader.decode.pydecode import parse
from reader.order.draws import AUGMENT, draws, key_digest
from reader.records.record_offsets import Descriptors, fetch
from reader.routes.shared_blocks import new_block, unlink_all
from reader.values.one_line import one_line
from schemas.errors import Error
from schemas.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt


class TransformError(Error, RuntimeError):
    """A user's transform failed: one line naming the function and the example."""


def example_rng(seed: int, key: str, epoch: int, view: int) -> np.random.Generator:
    """The rng of one view of one example in one epoch: the same on every machine, in
    every process, after any resume."""
    word = int(draws(1, seed, AUGMENT, key_digest(key), epoch, view)[0])
    return np.random.Generator(np.random.PCG64(word))


_WORKER: dict = {"blocks": {}}  # a worker process's transform, config and mapped blocks


def init(payload: bytes, name: str, config: tuple, prefix: str | None, lifeline) -> None:
    """A worker process's start: it ends when ``lifeline`` does (``_watch``) or Ctrl-C
    comes (``_interrupt``); a transform that cannot be rebuilt here is said by its
    first batch."""
    # first: the handler says a Ctrl-C on ``lifeline`` (one before it: Python's own)
    _WORKER.update(name=name, config=config, prefix=prefix, lifeline=lifeline, process=True)
    signal.signal(signal.SIGINT, _interrupt)
    threading.Thread(target=_watch, args=(lifeline,), daemon=True).start()
    _reuse_heap()
    try:
        _WORKER["transform"] = pickle.loads(payload)
    except BaseException as e:  # noqa: BLE001 - unpickling runs the user's code
        _WORKER["broken"] = f"{type(e).__name__}: {e}".replace("\n", " ")


# glibc's malloc in a worker: arrays up to 32 MB (its most) from the heap, and up to
# 64 MB of it kept when freed. By default an array over 128 KB (a decoded photo, a resized image)
# is a fresh mmap, its pages faulted in and zeroed each batch: 67 faults and 200 us of
# system CPU an image at 224x224, a seventh of its decode (benchmarks/HISTORY.md).
_HEAP = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20))


def _reuse_heap() -> None:
    """Large arrays reuse the heap's freed memory (``_HEAP``), on glibc."""
    mallopt(_HEAP)


_LEAVING = threading.Lock()  # held by the process ending (``_watch``, ``_interrupt``)


def _watch(lifeline) -> None:
    """Ends this process, its blocks unlinked, once the reader's end of ``lifeline``
    closes: the read ended or was left, or the reader's process died (kill -9: a
    process waiting for work would wait forever, holding the fork server and the
    resource tracker)."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    with _LEAVING:
        unlink_all(_WORKER)
        os._exit(0)


def _interrupt(signum, frame) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) in a worker: it says so to the
    reader (``_broken``) and ends at once, whatever its transform is doing (the read is
    over: nothing left to wait for)."""
    with contextlib.suppress(OSError):
        _WORKER["lifeline"].send_bytes(b"Ctrl-C")
    with _LEAVING:  # not between a block's unlink and its word to the resource tracker
        os._exit(0)  # the reader unlinks the blocks


def serve(pipe, initargs: tuple) -> None:
    """A worker process (``reader.routes.workers``): started by ``init(*initargs)``, then
    each batch it is sent run (``work``) and its answer sent back, or its error; an
    empty message, or the reader's end of ``pipe`` closed, ends it."""
    init(*initargs)
    while True:
        try:
            data = pipe.recv_bytes()
        except (EOFError, OSError):
            return
        if not data:
            return
        try:
            answer = ("ok", work(*pickle.loads(data)))
        except BaseException as e:  # noqa: BLE001 - raised in the reader, where it waits
            # alone: the errors it was raised from need not unpickle in the reader (a
            # library such as tblib, imported by the script, pickles them with it)
            e.__cause__ = e.__context__ = e.__traceback__ = None
            answer = ("error", e)
        try:
            pipe.send(answer)
        except (EOFError, OSError):
            return
        except Exception as e:  # noqa: BLE001 - an error that does not pickle: its words
            pipe.send(("error", TransformError(f"{type(e).__name__}: {e}")))


def work(task: tuple, spare: str | None) -> dict:
    """``run`` in a worker process."""
    if "broken" in _WORKER:
        raise TransformError(
            f"transform {_WORKER['name']} cannot be rebuilt in a worker process "
            f"({_WORKER['broken']}): define it at the top level of a module the script "
            "imports, or pass num_processes=0"
        )
    return run(task, spare)


def run(task: tuple, spare: str | None = None, worker: dict | None = None) -> dict:
    """One batch in a worker (``worker``: the transform, config and mapped blocks; a
    process's own by default): each image decoded once, each view transformed; the
    arrays go into ``spare`` (a free block, its arrays gone) when it is large
    enough."""
    worker = _WORKER if worker is None else worker
    transform = worker["transform"]
    channels, image_size, seed, views, augment, skip = worker["config"]
    rows, failed, stand_in = [], [], {}
    _fetch_placed(task, worker, skip, failed)
    for chunk in range(0, len(task[0]), _CHUNK):
        part = [column[chunk : chunk + _CHUNK] for column in task]
        if skip:
            images = _decoded_or_stood_in(
                task, chunk, part, (channels, image_size), failed, stand_in
            )
        elif augment is None and image_size is not None:  # resized while still in cache
            images = [pixels.resize(pixels.decode(e, channels), image_size) for e in part[0]]
        else:
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
                    raise fields_differ(transform, rows[0], example["key"], example)
                rows.append(example)
    return {**_stack(rows, spare, worker), "decoded": len(task[0]), "failed": failed}


_CHUNK = 16  # images decoded at a time: their boxes drawn in one call, memory bounded


def _fetch_placed(task, worker: dict, skip: bool, failed: list) -> None:
    """The batch's placed rows (``reader.records.source.Batch``) fetched from their shards and
    parsed here, each row's image, label and key set in ``task`` (a padding row's
    label and key stay blank); with ``skip``, a row that cannot be read is left None
    (a stand-in, masked) and said in ``failed``, else its error is raised."""
    images, labels, keys, _, real = task
    fds = worker.setdefault("fds", Descriptors())
    placed = [(e[0], row) for row, e in enumerate(images) if type(e) is tuple]
    for _, row in sorted(placed):  # shard by shard, each opened once a batch
        place, kind, root = images[row]
        try:
            image, label, key = parse(fetch(place, fds), kind, root)
            images[row] = image.tobytes()  # (a view of the parse's bytes: copied once)
        except (MemoryError, ImportError):
            raise
        except Exception as e:  # noqa: BLE001 - damage shows as any parse error
            if not skip:
                raise
            images[row] = None
            if real[row]:
                failed.append((row, None, one_line(e)))
            continue
        if real[row]:
            labels[row], keys[row] = label, key


def _decoded_or_stood_in(task, chunk: int, part: list, shape, failed, stand_in: dict) -> list:
    """``part``'s images (rows ``chunk`` on of ``task``), an image that fails to decode
    (``on_error="skip"``) made a padding row: masked, keyless, its pixels the first of
    the batch that decode (zeros where none does; found once, in ``stand_in``), its row
    and reason in ``failed`` (a real row's: a padding row's image is a real row's)."""
    channels, image_size = shape
    images = []
    for row, encoded in enumerate(part[0], chunk):
        try:
            if encoded is not None:  # (None: it could not be fetched, said already)
                images.append(pixels.decode(encoded, channels))
                continue
        except (MemoryError, ImportError):
            raise
        except Exception as e:  # noqa: BLE001 - a damaged image fails in many ways
            if task[4][row]:
                said = _ADDRESS.sub("", f"{type(e).__name__}: {e}".splitlines()[0])
                # the same words on every read
                failed.append((row, task[2][row], f"the image does not decode: {said}"))
        for column, blank in zip(part[1:], (0, "", 0, False)):
            column[row - chunk] = blank
        if "image" not in stand_in:
            stand_in["image"] = _stand_in(task[0], channels, image_size)
        images.append(stand_in["image"].copy())  # a transform may write to its own
    return images


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # in "<_io.BytesIO object at 0x7f...>"


def _stand_in(encoded: list, channels, image_size) -> np.ndarray:
    """The first of a batch's images that decodes, else zeros (``image_size``'s, else
    one pixel): a failed row's pixels, the same on every read."""
    for one in encoded:
        with contextlib.suppress(Exception):
            if one is not None:
                return pixels.decode(one, channels)
    return np.zeros((*(image_size or (1, 1)), channels or 3), np.uint8)


def _transformed(transform, example: dict, seed: int) -> dict:
    """The user's transform of one view, with its rng; its failure in one line."""
    key, epoch, view = example["key"], example["epoch"], example["view"]
    try:
        out = transform(example, example_rng(seed, key, epoch, view))
    except BaseException as e:  # noqa: BLE001 - the user's code (sys.exit too): one line
        if isinstance(e, KeyboardInterrupt) and not _WORKER.get("process"):
            raise  # Ctrl-C, in the reader's process (num_processes=0)
        raise TransformError(
            f"transform {name_of(transform)} failed on key {key!r} (epoch {epoch}, view {view}): "
            f"{type(e).__name__}: {_said(e)}".replace("\n", " ")
        ) from None
    if not isinstance(out, collections.abc.Mapping):
        raise TransformError(
            f"transform {name_of(transform)} returned {type(out).__name__} on key {key!r} "
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


def fields_differ(transform, first: dict, key, fields) -> TransformError:
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
        size += -(-math.prod(shape) * dtype.itemsize // 64) * 64  # 64-byte aligned
    block, dropped = new_block(spare, size, worker)
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


def name_of(transform) -> str:
    """A transform's name in a message: a function's, or a callable object's class."""
    return getattr(transform, "__qualname__", None) or type(transform).__qualname__
