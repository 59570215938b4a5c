"""Worker processes for the local runner's ``multi_processing`` mode, forked ready.

Beam starts each such worker as a fresh ``python -m ...sdk_worker_main``, which
spends about 2.5 s of CPU importing Beam and the steps before it takes work,
while the job waits (on 2 cores, 3 s of a 15 s convert of 20,000 photos). Here
the driver starts one process first, the fork server, as soon as it knows the
run is local and ``multi_processing``: it imports what a worker runs while the
driver imports Beam and builds the pipeline (on another core), then forks a
worker for each one Beam starts. Beam's command for a worker becomes the small
client below (``_fork_client.py``, the standard library alone): it hands the
environment Beam gave it (the control address, the job's options) to the
server, and ends with the worker's exit code.

A fork server, not a fork of the driver: the server has run nothing but
imports (no thread, no gRPC channel), so each fork is clean, in a test process
or a notebook as from the command line. Without the server (it failed to
start, or died) the client starts Beam's own worker instead: never slower
than before, never stuck. The server ends when the driver closes its stdin
(the run ended, or the driver died), stopping any worker still running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

from beam_jobs._fork_client import _ended, read_exactly
from schemas.errors import Error, InvalidValueError

log = logging.getLogger(__name__)

# The variable the driver gives the local runner the server's socket path in.
ENV = "EVENSHARD_FORK_SERVER"
_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fork_client.py")
# How often the server looks for ended workers (their clients wait for the code).
_POLL_S = 0.02
_FOLDER_PREFIX = "evenshard-workers-"  # the temp folder of the server's socket (mode 0700)
_SOCKET_PATH_MAX = 108  # bytes of a Unix socket's path, its NUL included (Linux)


_RUNNING: dict = {}  # the servers of the blocks running now -> their folders (``stop_now``)


def wanted(pipeline_args: list[str]) -> bool:
    """Whether the run's flags (runner aliases resolved) start the local runner's worker
    processes (and the system can fork)."""
    from beam_jobs.runners import LOCAL_RUNNER

    flags = " ".join(pipeline_args)
    return (
        sys.platform.startswith("linux")
        and f"--runner={LOCAL_RUNNER}" in pipeline_args
        and re.search(r"--direct_running_mode[= ]multi_processing\b", flags) is not None
    )


@contextlib.contextmanager
def fork_server(pipeline_args: list[str]):
    """Runs a fork server while the block runs, when ``pipeline_args`` start worker
    processes (set ``EVENSHARD_FORK_SERVER`` empty for Beam's own workers); the local
    runner finds it through ``ENV``. Yields the server's process, or None."""
    if not wanted(pipeline_args) or ENV in os.environ:
        yield None
        return
    folder = tempfile.mkdtemp(prefix=_FOLDER_PREFIX)
    if len(os.fsencode(folder)) + len("/socket") >= _SOCKET_PATH_MAX:
        os.rmdir(folder)  # a long TMPDIR (a test's, say): bind would fail there
        folder = tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir="/tmp")
    path = os.path.join(folder, "socket")
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # bound and listening before the server starts: a worker that asks early
        # waits in the backlog; the driver's copy is closed once the server has
        # its own, so a server that dies refuses connections (no wait forever)
        listener.bind(path)
        listener.listen(64)
        with listener:
            # a process group of its own: Ctrl-C at the terminal reaches neither it
            # nor its workers (the driver stops them), even while it still imports
            server = subprocess.Popen(
                [sys.executable, "-m", "beam_jobs.forked_workers", str(listener.fileno())],
                stdin=subprocess.PIPE,
                pass_fds=(listener.fileno(),),
                process_group=0,
            )
    except OSError as e:  # Beam's own workers, as without the server
        log.info("evenshard: no fork server (%s); workers start fresh", e)
        shutil.rmtree(folder, ignore_errors=True)
        yield None
        return
    os.environ[ENV] = path
    _RUNNING[server] = folder
    try:
        yield server
    finally:
        _RUNNING.pop(server, None)
        os.environ.pop(ENV, None)
        server.stdin.close()  # the server's signal to stop
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def stop_now() -> None:
    """Stops the running servers and their workers now (Ctrl-C): the workers would
    otherwise find their runner gone first and each print a thread's traceback. A
    server and its workers are a process group of their own: SIGTERM to the group
    ends the workers and the server, which clears its folder (still importing, it
    has none: cleared here); SIGKILL if they have not ended in 5 s."""
    for server, folder in list(_RUNNING.items()):
        for signum in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.killpg(server.pid, signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=5)
                break
        shutil.rmtree(folder, ignore_errors=True)


class WorkerLost(Error, RuntimeError):
    """A worker process of the local runner ended before its work was done (killed, out
    of memory, crashed): one line naming it (the pid its progress lines give), how it
    ended, and what to do."""

    @classmethod
    def of(cls, worker_id: str, message: str) -> WorkerLost:
        """The error of the worker ``worker_id`` (Beam's name), from the file its fork
        client left (its pid and exit code), else from Beam's ``message`` (the code
        alone: "Worker subprocess exited with return code -9")."""
        pid, code = None, None
        try:
            folder = os.path.dirname(os.environ.get(ENV) or "")
            with open(os.path.join(folder, _ended({"WORKER_ID": worker_id}))) as f:
                pid, code = (int(v) for v in f.read().split())
        except (OSError, ValueError):  # Beam's own worker: no file
            found = re.search(r"return code (-?\d+)", message)
            code = int(found.group(1)) if found else None
        who = f"worker process {pid}" if pid else "a worker process"
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else "a signal"
            how = f"was killed by {name} (signal {-code})"
            if -code == signal.SIGKILL:
                how += (
                    "; if nobody sent it, the system ran out of memory (see dmesg): give the "
                    "job more memory or fewer workers (--direct_num_workers)"
                )
        else:
            how = f"ended early ({message})"
        return cls(f"{who} {how}; run the same command again: it clears what this run left")


def command(path: str) -> str:
    """The shell command Beam runs for a worker: the client of the server at ``path``,
    Ctrl-C ignored from its start (the driver stops the workers; a client still
    starting would print a KeyboardInterrupt's traceback)."""
    client = " ".join(shlex.quote(a) for a in (sys.executable, "-S", _CLIENT, path))
    return f"trap '' INT; exec {client}"


# ----------------------------------------------------------------------------- the server


def _preload() -> None:
    """What every worker imports: Beam's worker, the steps' modules, the decoders (and
    not Beam's optional imports that no step uses)."""
    from beam_jobs.runners import lean_imports

    lean_imports()
    import apache_beam.runners.worker.sdk_worker_main  # noqa: F401
    import simplejpeg  # noqa: F401 - --verify full's JPEG decoder (schemas.images)
    from PIL import Image

    import beam_jobs.steps  # noqa: F401 - every step's DoFns

    # The common formats' plugins first, then the rest: Pillow tries them in the order
    # they were imported, and init() alone imports them by name, where IM, IPTC and
    # twenty others come before JPEG (a JPEG opened in 50 us, not 29; a worker not
    # forked here imports them in this order too: Image.open calls preinit first).
    Image.preinit()
    Image.init()


def serve(listener: socket.socket) -> None:
    """Forks a worker for each client, until stdin ends; then stops those still running."""
    # The server and its workers (which keep this) ignore Ctrl-C: they stop as the
    # driver ends (the server's stdin closes), or at once on SIGTERM (``stop_now``),
    # the server stopping its workers either way, with no traceback of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)
    _preload()
    children: dict[int, socket.socket] = {}
    stdin = sys.stdin.fileno()
    try:
        while True:
            _reap(children)
            ready, _, _ = select.select([listener, stdin], [], [], _POLL_S)
            if stdin in ready:  # closed (or written to): the driver is done
                return
            if listener in ready:
                conn, _ = listener.accept()
                fds: list[int] = []
                try:
                    conn.settimeout(10)
                    head, fds, _, _ = socket.recv_fds(conn, 4, 3)
                    request = read_exactly(conn, struct.unpack("!I", head)[0])
                    if request is None or len(fds) != 3:
                        raise InvalidValueError("the client closed early, or sent no stdio")
                    request = json.loads(request)
                except (OSError, ValueError, struct.error):
                    _close(fds)
                    conn.close()
                    continue
                # SIGTERM held across the fork: the child is never the server stopping
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                pid = os.fork()
                if pid == 0:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                    # the worker holds no socket of the server's: a client sees its
                    # server's end, not a sibling's copy kept open
                    for held in (listener, conn, *children.values()):
                        held.close()
                    _worker(request, fds)  # never returns
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                _close(fds)
                with contextlib.suppress(OSError):
                    conn.sendall(struct.pack("!i", pid))
                children[pid] = conn
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        for pid, conn in children.items():
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            conn.close()
        # the socket's folder, which a driver killed (no cleanup of its own) leaves
        folder = os.path.dirname(listener.getsockname())
        if os.path.basename(folder).startswith(_FOLDER_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)


def _stop(_signum, _frame) -> None:
    raise SystemExit(0)  # through serve's ``finally``: its workers stopped, its folder cleared


def _reap(children: dict[int, socket.socket]) -> None:
    """Tells the client of each ended worker its exit code."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            conn.close()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _worker(request: dict, fds: list[int]) -> None:
    """In the forked child: Beam's worker main with the client's environment, stdin,
    stdout and stderr; exits."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _close(fds)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main(sys.argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as a fresh worker: a traceback, exit 1
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
    # nothing to tear down: Python's finalization of Beam's modules took 0.7 s, which
    # the driver waited for at the end of every run
    sys.stderr.flush()
    os._exit(0)
