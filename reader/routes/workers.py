"""The worker processes of one read, each with a pipe of its own: a batch goes to the
process with the fewest batches unanswered (the answers already there read first, so a
process that is done gets the next one, as from a shared queue), and each answer is read
from its process's pipe by the reader's own thread. No manager thread and no queue
between them: a ``concurrent.futures`` pool spent about 320 us of the reader's CPU a
batch on its threads' hand-offs (benchmarks/HISTORY.md, 2026-11-29).

A batch whose message is small (places, keys: a few KB) is written by the reader
itself: at most two are in a process's pipe at once, far under its buffer, so the
write never waits. A large one (the encoded images of a bucket's records) goes through
one sending thread, in order, so the reader never waits on a process that is itself
waiting to hand back an answer; a small one after it waits its turn there too, so each
process gets its batches in order.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from multiprocessing.reduction import ForkingPickler

from reader.routes.preprocess_worker import serve
from schemas.errors import OperationError

SMALL = 16 << 10  # bytes a message may have to be written by the reader itself


class Died(Exception):
    """A process ended before it answered (killed, out of memory, Ctrl-C)."""


class Workers:
    """``processes`` processes of ``context``, each running ``serve(its pipe, initargs)``."""

    def __init__(self, processes: int, context, initargs: tuple):
        self.pipes, self.processes = [], []
        self._sending: queue.SimpleQueue | None = None  # (pipe, message), for ``_send``
        self._sender: threading.Thread | None = None
        self._queued = 0  # messages given to the sending thread and not yet written
        self._lock = threading.Lock()
        self._owed: list[collections.deque] = []  # each process's batches unanswered
        self._answers: dict = {}  # number -> answer, read before it was asked for
        for _ in range(processes):
            here, there = context.Pipe()
            process = context.Process(target=serve, args=(there, initargs), daemon=True)
            process.start()
            there.close()
            self.pipes.append(here)
            self.processes.append(process)
            self._owed.append(collections.deque())

    def submit(self, number: int, task) -> None:
        """Sends ``task`` (picklable) as batch ``number`` to the process with the fewest
        batches unanswered; raises Died if it is gone."""
        self._take_ready()
        index = min(range(len(self.pipes)), key=lambda i: len(self._owed[i]))
        self._owed[index].append(number)
        self._write(index, ForkingPickler.dumps(task))

    def _take_ready(self) -> None:
        """The answers already in the pipes, read (a process answers in order): one look
        at every pipe at once."""
        owing = {pipe: owed for pipe, owed in zip(self.pipes, self._owed) if owed}
        for pipe in multiprocessing.connection.wait(list(owing), 0) if owing else ():
            try:
                self._answers[owing[pipe][0]] = _read(pipe)
            except Died:  # gone: its batch's wait says so
                continue
            owing[pipe].popleft()

    def _write(self, index: int, data) -> None:
        pipe = self.pipes[index]
        if len(data) <= SMALL and not self._queued:  # none ahead of it in the thread
            try:
                pipe.send_bytes(data)
            except OSError:  # the process is gone (its answer's wait names the batch)
                raise Died from None
            return
        with self._lock:
            self._queued += 1
        if self._sending is None:
            self._sending = queue.SimpleQueue()
            self._sender = threading.Thread(
                target=self._send, args=(self._sending,), name="evenshard-send", daemon=True
            )
            self._sender.start()
        self._sending.put((pipe, data))

    def _send(self, sending: queue.SimpleQueue) -> None:
        """Writes what ``sending`` is given, in order, until None (its own queue: ``_ended``
        drops the reference while batches are still queued in it)."""
        while (item := sending.get()) is not None:
            pipe, data = item
            with contextlib.suppress(OSError):  # a process gone: its answer's wait says so
                pipe.send_bytes(data)
            with self._lock:
                self._queued -= 1

    def result(self, number: int):
        """The answer to batch ``number`` (its process's error raised here); Died when
        its process ended first."""
        if number not in self._answers:
            index = next(i for i, owed in enumerate(self._owed) if number in owed)
            pipe, process, owed = self.pipes[index], self.processes[index], self._owed[index]
            while number in owed:
                while not pipe.poll(0.5):  # (a process ended writes nothing more)
                    if not process.is_alive() and not pipe.poll(0):
                        raise Died
                self._answers[owed[0]] = _read(pipe)
                owed.popleft()
        kind, value = self._answers.pop(number)
        if kind == "error":
            raise value
        return value

    def unread(self) -> list:
        """The answers read before they were asked for and never asked for (a read left
        early): their blocks are the reader's to unlink."""
        return [value for kind, value in self._answers.values() if kind == "ok"]

    def stop(self, wait: float) -> None:
        """Every batch answered: each process told to end (an empty message) and waited
        for (``_ended``)."""
        for index in range(len(self.pipes)):
            with contextlib.suppress(Died):
                self._write(index, b"")
        self._ended(wait)

    def leave(self, wait: float) -> None:
        """Left early (Ctrl-C, an error, a break; the caller closed the processes'
        lifeline, so each ends whatever its transform is doing): waited for
        (``_ended``)."""
        self._ended(wait)

    def _ended(self, wait: float) -> None:
        """The sending thread told to end; each process waited for up to ``wait`` s, then
        killed: nothing waits on a process for ever. The pipes closed once the thread
        has ended (a write it is in fails when its process goes)."""
        if self._sending is not None:
            self._sending.put(None)
            self._sending = None
        deadline = time.monotonic() + wait
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.join(wait)
        if self._sender is not None:
            self._sender.join(wait)
        for pipe in self.pipes:
            pipe.close()


def _read(pipe):
    """An answer from ``pipe``, read whole; Died when its process is gone. An answer that
    does not unpickle here (an error class whose arguments do not rebuild it) is an
    error saying so: the pipe stays at the next answer."""
    try:
        data = pipe.recv_bytes()
    except (EOFError, OSError):
        raise Died from None
    try:
        return ForkingPickler.loads(data)
    except Exception as e:  # noqa: BLE001 - unpickling runs the classes' own code
        why = f"{type(e).__name__}: {e}"
        return "error", OperationError(f"a worker process's answer cannot be read here ({why})")
