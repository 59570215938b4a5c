"""multiprocessing's private names that evenshard relies on, and nowhere else.

``set_forkserver_preload`` replaces the list of modules the fork server imports; there
is no public way to read it, to add to what another library (or the user) set.
``pool_processes`` gives a ``concurrent.futures.ProcessPoolExecutor``'s processes, which
a read left early ends itself rather than wait on the pool (``reader.preprocess``);
``before_pools_join`` runs a function at exit before ``concurrent.futures`` waits on
every pool still running (a read never finished ends its processes first).
``check()`` says, naming the Python version, when a release changes that
(tests/test_compat.py runs it). Checked with Python 3.11 and 3.12.
"""

from __future__ import annotations

from multiprocessing import forkserver

from schemas.errors import OperationError

# the fork server's preload list (multiprocessing.forkserver.ForkServer)
_PRELOAD = "_preload_modules"
_SERVER = "_forkserver"
# a ProcessPoolExecutor's processes: {pid: multiprocessing.Process}
_PROCESSES = "_processes"


# threading's exit hooks (run last registered first, before threads are joined)
_AT_EXIT = "_register_atexit"


def before_pools_join(fn) -> None:
    """Runs ``fn`` at interpreter exit before ``concurrent.futures`` joins the threads
    of the process pools still running (which waits on their processes' work)."""
    import concurrent.futures.process  # noqa: F401 - its hook is registered first
    import threading

    getattr(threading, _AT_EXIT)(fn)


def pool_processes(pool) -> list:
    """The processes ``pool`` (a ``ProcessPoolExecutor``) has started so far."""
    return list((getattr(pool, _PROCESSES, None) or {}).values())


def forkserver_preload() -> list[str]:
    """The modules the fork server will import when it starts, as set so far."""
    return list(getattr(getattr(forkserver, _SERVER), _PRELOAD, ["__main__"]))


def check() -> None:
    """Raises RuntimeError, naming the name and the Python version, unless the fork
    server keeps its preload list where ``forkserver_preload`` reads it, and a
    ``ProcessPoolExecutor`` its processes where ``pool_processes`` does."""
    import concurrent.futures
    import sys

    server = getattr(forkserver, _SERVER, None)
    if server is None or not isinstance(getattr(server, _PRELOAD, None), list):
        raise OperationError(
            f"Python {sys.version.split()[0]}: multiprocessing.forkserver has no "
            f"{_SERVER}.{_PRELOAD} list (reader/compat_mp.py)"
        )
    import threading

    if not callable(getattr(threading, _AT_EXIT, None)):
        raise OperationError(
            f"Python {sys.version.split()[0]}: threading has no {_AT_EXIT} (reader/compat_mp.py)"
        )
    pool = concurrent.futures.ProcessPoolExecutor(1)  # starts no process before a submit
    try:
        if not isinstance(getattr(pool, _PROCESSES, None), dict):
            raise OperationError(
                f"Python {sys.version.split()[0]}: concurrent.futures.ProcessPoolExecutor "
                f"has no {_PROCESSES} dict (reader/compat_mp.py)"
            )
    finally:
        pool.shutdown()
