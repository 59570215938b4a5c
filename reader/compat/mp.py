"""multiprocessing's private names that evenshard relies on, and nowhere else.

``set_forkserver_preload`` replaces the list of modules the fork server imports; there
is no public way to read it, to add to what another library (or the user) set.
``before_pools_join`` runs a function at exit before ``concurrent.futures`` waits on
every pool still running and the threads are joined (a read never finished ends its
processes first: ``reader.routes.preprocess``).
``forkserver_without_main`` is a forkserver context whose processes do not import the
parent's ``__main__`` (a read with no user code in its processes needs no script
guard, and works from stdin): multiprocessing has no switch for it, so the stdlib's
own launch code runs with a ``spawn`` whose preparation data names no main module.
``check()`` says, naming the Python version, when a release changes that
(tests/test_compat.py runs it). Checked with Python 3.11 and 3.12.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import multiprocessing.context
import os
import threading
import types
import weakref
from multiprocessing import forkserver, spawn

from schemas.errors import OperationError

# the fork server's preload list (multiprocessing.forkserver.ForkServer)
_PRELOAD = "_preload_modules"
_SERVER = "_forkserver"
# threading's exit hooks (run last registered first, before threads are joined)
_AT_EXIT = "_register_atexit"


def before_pools_join(fn) -> None:
    """Runs ``fn`` at interpreter exit before ``concurrent.futures`` joins the threads
    of the process pools still running (which waits on their processes' work)."""
    import concurrent.futures.process  # noqa: F401 - its hook is registered first

    getattr(threading, _AT_EXIT)(fn)


_OPEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # made -> generator
_MADE = itertools.count()
_HOOKED: list = []
_REGISTRY = threading.Lock()  # _OPEN's additions and the exit's look at it


def closed_at_exit(generator):
    """``generator`` (a read's batches), closed at exit if still open then, with the
    others in the order they were made (outer first), before the pools join: its
    ``finally`` runs while the modules it calls stand. Left to the interpreter's
    teardown, it found their globals emptied ("'NoneType' object has no attribute
    'pop'")."""
    if not _HOOKED:
        _HOOKED.append(before_pools_join(_close_open))
        os.register_at_fork(after_in_child=_OPEN.clear)  # the parent's, not a child's
    with _REGISTRY:
        _OPEN[next(_MADE)] = generator
    return generator


def _close_open() -> None:
    with _REGISTRY:  # a read another thread starts meanwhile is not closed here
        open_now = sorted(_OPEN.keys())
    for made in open_now:
        generator = _OPEN.pop(made, None)
        if generator is not None:
            with contextlib.suppress(ValueError):  # running: the exit came from inside it
                generator.close()


def forkserver_preload() -> list[str]:
    """The modules the fork server will import when it starts, as set so far."""
    return list(getattr(getattr(forkserver, _SERVER), _PRELOAD, ["__main__"]))


# what tells a starting process to import the parent's __main__ (spawn.prepare)
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


def _preparation_without_main(name: str) -> dict:
    """``spawn.get_preparation_data``, less what makes the process import ``__main__``."""
    data = spawn.get_preparation_data(name)
    for key in _MAIN_KEYS:
        data.pop(key, None)
    return data


@functools.cache
def _popen_class() -> type:
    """``popen_forkserver.Popen``, its launch code the stdlib's own, run with a ``spawn``
    whose preparation data names no main module (built at the first process:
    ``popen_forkserver`` is not on every system)."""
    from multiprocessing import popen_forkserver

    launch = popen_forkserver.Popen._launch
    names = {**vars(popen_forkserver)}
    names["spawn"] = types.SimpleNamespace(
        **{**vars(spawn), "get_preparation_data": _preparation_without_main}
    )
    launch = types.FunctionType(launch.__code__, names, launch.__name__)
    return type("Popen", (popen_forkserver.Popen,), {"_launch": launch})


if hasattr(multiprocessing.context, "ForkServerContext"):  # (not on Windows)

    class ProcessWithoutMain(multiprocessing.context.ForkServerProcess):
        """A forkserver process that does not import the parent's ``__main__`` (pickled
        by reference as it starts: a module-level class)."""

        @staticmethod
        def _Popen(process_obj):
            return _popen_class()(process_obj)

    class _ForkServerWithoutMain(multiprocessing.context.ForkServerContext):
        Process = ProcessWithoutMain


def forkserver_without_main() -> multiprocessing.context.BaseContext:
    """A forkserver context (as ``multiprocessing.get_context("forkserver")``) whose
    processes do not import the parent's ``__main__``: what they run must come from
    importable modules. Its fork server is the process's one fork server."""
    return _ForkServerWithoutMain()


def check() -> None:
    """Raises RuntimeError, naming the name and the Python version, unless the fork
    server keeps its preload list where ``forkserver_preload`` reads it, its launch code
    its preparation data where ``forkserver_without_main`` replaces it, and threading
    its exit hooks where ``before_pools_join`` adds one."""
    import sys

    server = getattr(forkserver, _SERVER, None)
    if server is None or not isinstance(getattr(server, _PRELOAD, None), list):
        raise OperationError(
            f"Python {sys.version.split()[0]}: multiprocessing.forkserver has no "
            f"{_SERVER}.{_PRELOAD} list (reader/compat/mp.py)"
        )
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import popen_forkserver

        code = popen_forkserver.Popen._launch.__code__
        if code.co_freevars or not {"spawn", "get_preparation_data"} <= set(code.co_names):
            raise OperationError(
                f"Python {sys.version.split()[0]}: multiprocessing.popen_forkserver's "
                "Popen._launch no longer gets its preparation data from "
                "spawn.get_preparation_data alone (reader/compat/mp.py)"
            )
    if not callable(getattr(threading, _AT_EXIT, None)):
        raise OperationError(
            f"Python {sys.version.split()[0]}: threading has no {_AT_EXIT} (reader/compat/mp.py)"
        )
