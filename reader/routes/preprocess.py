"""Python preprocessing in worker processes: each image decoded once, a user's transform
run on it (once a view), the batches back in read order through shared memory.

The order is computed before preprocessing (``reader.records.source``); the pool maps the
numbered batches and they come back by number, so the output order is the read order
for any number of processes. Every random choice a transform makes draws from the rng
``example_rng(seed, key, epoch, view)`` gives (the order's keyed hash, purpose
``AUGMENT``), never from a process's own state: so the output is byte-identical for any
number of processes, after a resume at any step and after an elastic resize, and a
``ReadState`` needs nothing new.

Processes start with forkserver (spawn where there is none): a TensorFlow runtime
cannot be forked. A batch's arrays of one shape are stacked by the process into one
shared memory block, which the reader lends to the caller as the batch's arrays, no copy
made, and reuses once they are gone (``reader.routes.shared_blocks``); other values (strings,
dicts, arrays of other shapes) come pickled, as lists.

The processes end with the read, however it ends, whatever their transform is doing
(``reader.routes.preprocess_worker``: what a process does); the fork server and the resource
tracker end once no process of theirs is left. The blocks are named after the reader's
process, so a reader starting removes those of readers that died all at once
(``reader.routes.shared_blocks``).
"""

from __future__ import annotations

import atexit
import collections
import multiprocessing
import os
import pickle

from reader.compat import mp as compat_mp
from reader.routes import script_preload
from reader.routes.preprocess_worker import (
    TransformError,
    example_rng,
    fields_differ,
    name_of,
    run,
)
from reader.routes.shared_blocks import Blocks, sweep, unlink_block
from reader.routes.workers import Died, Workers
from schemas.errors import InvalidTypeError, OperationError

__all__ = ["Preprocess", "TransformError", "check_transform", "default_processes", "example_rng"]


def check_transform(transform) -> bytes:
    """The transform (checked callable by ``option_groups.PythonStage``), pickled for
    the worker processes; refused now when it cannot be (a lambda, a local function),
    not in a process later."""
    try:
        return pickle.dumps(transform)
    except Exception as e:  # noqa: BLE001 - pickling can fail in many ways
        raise InvalidTypeError(
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
        skip: ``RecordSource.skip`` (``on_error="skip"``): the ledger's lines of a
            batch's rows that failed to parse (``Batch.failed``) or whose image failed
            to decode (its row then masked), in row order as the batch is taken; or
            None: the read raises.
    """

    def __init__(
        self,
        transform,
        processes: int,
        channels,
        image_size,
        seed,
        views=1,
        augment=None,
        skip=None,
    ):
        self.transform = transform
        self.config = (channels, image_size, seed, views, augment, skip is not None)
        self.skip = skip
        self.processes = processes
        self.decoded = 0  # images decoded (tests count them: one a record, whatever views)
        self.first = None  # the first batch's fields, and its first key

    def map(self, batches):
        """Outputs of ``batches`` (``reader.records.source.Batch``), in order: dicts of stacked
        arrays or lists, with ``key``, ``view``, ``epoch``, ``mask``; ended at exit if
        still open (``compat_mp.closed_at_exit``)."""
        return compat_mp.closed_at_exit(self._map(batches))

    def _map(self, batches):
        sweep()
        # lent at once: as many as are in flight (a caller holding more gets copies)
        blocks = Blocks(lend_most=max(4, 2 * self.processes))
        if self.processes == 0:  # this read's own state: another read may run beside it
            worker = {"transform": self.transform, "config": self.config, "blocks": {}}
            worker["prefix"] = blocks.prefix
            try:
                for batch in batches:
                    done = run(_task(batch), blocks.spare(), worker)
                    yield self._collect(done, blocks, _named(batch))
            finally:  # the blocks made here first: unlinked and unregistered
                if "fds" in worker:  # the shards its placed rows were fetched from
                    worker["fds"].close()
                for name, memory in worker["blocks"].items():
                    unlink_block(name, memory)
                blocks.unlink()
            return
        script = self.transform is not None  # the processes import the script
        if script and (why := script_preload.unimportable_script()):
            raise OperationError(  # said before the processes say it in a traceback each
                f"transform {name_of(self.transform)} runs in worker processes, which "
                f"import the training script, and {why}: put the script's work under "
                "'if __name__ == \"__main__\":' in a file (as for DataLoader workers), "
                "or pass num_processes=0"
            )
        context = _context(script)
        held, lifeline = context.Pipe()  # ``held``: this process's alone (``_watch``)
        payload = check_transform(self.transform)
        initargs = (payload, name_of(self.transform), self.config, blocks.prefix, lifeline)
        workers = Workers(self.processes, context, initargs)
        pending: collections.deque = collections.deque()
        finished = False
        _RUNNING[id(workers)] = (workers, held)  # a read never finished: ended at exit
        atexit.register(blocks.unlink)  # (tf.data's, at Ctrl-C), its blocks unlinked
        try:
            for number, batch in enumerate(batches):
                try:
                    workers.submit(number, (_task(batch), blocks.spare()))
                except Died:  # a process died before its batch was asked for
                    _broken(pending[0][0] if pending else number, held)
                pending.append((number, _named(batch)))
                if len(pending) >= 2 * self.processes:  # bounded: 2 batches a process
                    number, named = pending.popleft()
                    yield self._collect(_result(workers, number, held), blocks, named)
            while pending:
                number, named = pending.popleft()
                yield self._collect(_result(workers, number, held), blocks, named)
            finished = True
        finally:  # left early (Ctrl-C, an error, a break): the processes end now
            _RUNNING.pop(id(workers), None)
            if finished:
                workers.stop(LEAVE_WAIT)
            else:
                _leave(workers, held)
            held.close()
            lifeline.close()
            for answer in workers.unread():  # blocks handed over but never read
                blocks.known.add(answer["block"])
            blocks.unlink()
            atexit.unregister(blocks.unlink)

    def _collect(self, done: dict, blocks: Blocks, named) -> dict:
        """A worker's batch as arrays lent from its block; its images that failed to
        decode handed to ``skip`` with ``named`` (the batch's step and fetches)."""
        self.decoded += done.pop("decoded")
        step, fetches, parsed = named
        lines = [(row, fetch, None, reason) for row, fetch, reason in parsed or ()]
        for row, key, reason in done.pop("failed"):  # (key None: the record's unread)
            fetch = fetches[row] if fetches is not None else None
            lines.append((row, fetch, key, reason))
        for _, fetch, key, reason in sorted(lines, key=lambda line: line[0]):
            self.skip(fetch, step, reason, key)
        out = dict(done.pop("lists"))
        out.update(blocks.arrays(done["block"], done["dropped"], done.pop("arrays")))
        if self.first is None:
            self.first = {**dict.fromkeys(out), "key": out["key"][0]}
        elif out.keys() != self.first.keys():  # every batch has the first one's fields
            raise fields_differ(self.transform, self.first, out["key"][0], out)
        return out


# imported once by the fork server, not by every process of every read (0.4 s -> 0.1 s a
# pool); none of them imports TensorFlow
_PRELOAD = (
    "reader.routes.preprocess",
    "reader.routes.script_preload",
    "reader.records.record_offsets",
    "reader.decode.pydecode",
    "numpy",
    "cv2",
    "simplejpeg",
    "PIL.Image",
    "PIL.PngImagePlugin",
)


def _context(script: bool):
    """Forkserver (a TensorFlow runtime cannot be forked; spawn where there is none),
    its server preloading what the processes import, beside what it preloads already:
    ours, and the training script's own imports (``reader.routes.script_preload``).

    ``script``: the processes import the training script (``__main__``), as
    multiprocessing's do, for a transform defined there; without a transform they run
    only our modules, so they do not: a script needs no ``if __name__ == "__main__":``
    guard and may come from stdin or a notebook, as for the tf graph.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    preload = compat_mp.forkserver_preload()
    if not script:  # (a server it starts does not import the script either: 3.13's would)
        context = compat_mp.forkserver_without_main()
        preload = [m for m in preload if m != "__main__"]
    context.set_forkserver_preload(preload + [m for m in _PRELOAD if m not in preload])
    if names := script_preload.script_imports():
        script_preload.start_server(names)
    return context


_RUNNING: dict = {}  # id(workers) -> (workers, held) of the reads not ended


def _end_running_reads() -> None:
    """At exit, before ``concurrent.futures`` waits on every pool still running: the
    reads never finished (a dataset's iterator kept to the end) are left, their
    processes ended, not waited for."""
    for workers, held in list(_RUNNING.values()):
        _leave(workers, held)


compat_mp.before_pools_join(_end_running_reads)
# a forked child (a DataLoader worker) inherits the reads, not their ending
os.register_at_fork(after_in_child=_RUNNING.clear)


LEAVE_WAIT = 10.0  # seconds a process has to end once its read is left (ms, as a rule)


def _leave(workers: Workers, held) -> None:
    """The read left early: ``held`` closed, so each process's watcher ends it (its
    transform unwaited); one not ended in ``LEAVE_WAIT`` s is killed (``Workers.leave``).
    Nothing waits on a process for ever: one lost would hold the read, and the caller."""
    held.close()
    workers.leave(LEAVE_WAIT)


def _result(workers: Workers, number: int, held):
    try:
        return workers.result(number)
    except Died:
        _broken(number, held)


def _broken(number: int, held):
    """A process of the pool ended: Ctrl-C (the processes said so on ``held``: raised
    here, where tf.data waits, as the caller's Ctrl-C is not), or it died."""
    if not held.closed and held.poll():  # (closed: the read was left at exit)
        raise KeyboardInterrupt from None
    _died(number)


def _died(number: int):
    raise OperationError(
        f"a preprocessing process died while batch {number} of this read was "
        "transformed (killed? out of memory? interrupted? or a script that iterates without "
        "'if __name__ == \"__main__\":', which worker processes need, as "
        "PyTorch's DataLoader workers do): the read stops here"
    ) from None


def _named(batch) -> tuple:
    """What names a batch's rows in the ledger: (the batch's step, its rows' fetches,
    those that failed to parse)."""
    return batch.step, batch.fetches, batch.failed


def _task(batch) -> tuple:
    return (  # a placed row as it is: a worker fetches it (``_fetch_placed``)
        [e if type(e) is tuple else bytes(e) for e in batch.encoded],
        batch.label.tolist(),
        list(batch.key),
        batch.epoch.tolist(),
        batch.mask.tolist(),
    )


def default_processes() -> int:
    """Worker processes by default: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
