"""A local worker, as Beam starts one: handed to the fork server (``forked_workers``).

Run as ``python -S _fork_client.py SOCKET`` (the standard library alone, no
site: it starts in milliseconds). Sends the environment Beam gave it, and its
stdin, stdout and stderr, to the server, which forks a worker with them, and
exits with that worker's exit code (an early end, its pid and code also in a file the
driver reads: ``forked_workers.WorkerLost``); a signal it gets goes to the worker. With
its server dead (the socket's folder still there) it becomes Beam's own worker
process; with the folder gone the run is ending, and it exits 1.
"""

import json
import os
import signal
import socket
import struct
import sys


def read_exactly(conn, n):
    """``n`` bytes from the socket ``conn``, or None if it closes first (the fork
    server reads its clients with this too)."""
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            return None
        data += part
    return data


def main(path):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        if not os.path.isdir(os.path.dirname(path)):
            return 1  # the server ended and cleared its folder: the run is ending
        # the server died: a fresh worker, as Beam's command starts it
        python = sys.executable
        os.execv(python, [python, "-m", "apache_beam.runners.worker.sdk_worker_main"])
    request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode()
    # the worker's stdin, stdout and stderr are this process's, as Beam gave them
    socket.send_fds(conn, [struct.pack("!I", len(request))], [0, 1, 2])
    conn.sendall(request)
    pid = read_exactly(conn, 4)
    if pid is None:
        return 1
    pid = struct.unpack("!i", pid)[0]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for signum in (signal.SIGTERM, signal.SIGHUP):  # Ctrl-C: ignored, as by the worker
        signal.signal(signum, forward)
    code = read_exactly(conn, 4)
    if code is None:  # the server ended first
        return 1
    code = struct.unpack("!i", code)[0]
    if code:  # the driver names the worker and how it ended (forked_workers.WorkerLost)
        try:
            with open(os.path.join(os.path.dirname(path), _ended(os.environ)), "w") as f:
                f.write(f"{pid} {code}")
        except OSError:
            pass
    return code if code >= 0 else 128 - code


def _ended(env):
    """The name of the file, in the server's folder, telling how a worker ended."""
    return "ended-" + env.get("WORKER_ID", "")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
