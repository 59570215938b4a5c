"""multiprocessing's private names that evenshard relies on, and nowhere else.

``set_forkserver_preload`` replaces the list of modules the fork server imports; there
is no public way to read it, to add to what another library (or the user) set.
``check()`` says, naming the Python version, when a release changes that
(tests/test_compat.py runs it). Checked with Python 3.11 and 3.12.
"""

from __future__ import annotations

from multiprocessing import forkserver

from schemas.errors import OperationError

# the fork server's preload list (multiprocessing.forkserver.ForkServer)
_PRELOAD = "_preload_modules"
_SERVER = "_forkserver"
_SHM_NAME = "_name"  # SharedMemory's name as the resource tracker holds it ("/name")


def forkserver_preload() -> list[str]:
    """The modules the fork server will import when it starts, as set so far."""
    return list(getattr(getattr(forkserver, _SERVER), _PRELOAD, ["__main__"]))


def untrack(memory) -> None:
    """Drops the resource tracker's claim on a block another process already unlinked:
    before Python 3.13 attaching registers a block, and ``SharedMemory.unlink()`` raises
    before unregistering when the name is gone (the tracker then warns of a leak at exit
    and unlinks a name that is not there)."""
    from multiprocessing import resource_tracker

    resource_tracker.unregister(getattr(memory, _SHM_NAME), "shared_memory")


def check() -> None:
    """Raises RuntimeError, naming the name and the Python version, unless the fork
    server keeps its preload list where ``forkserver_preload`` reads it."""
    import sys
    from multiprocessing import shared_memory

    if not hasattr(shared_memory.SharedMemory, "unlink") or _SHM_NAME not in (
        shared_memory.SharedMemory.__init__.__code__.co_names
    ):
        raise OperationError(
            f"Python {sys.version.split()[0]}: SharedMemory keeps no {_SHM_NAME} "
            "(reader/compat_mp.py)"
        )
    server = getattr(forkserver, _SERVER, None)
    if server is None or not isinstance(getattr(server, _PRELOAD, None), list):
        raise OperationError(
            f"Python {sys.version.split()[0]}: multiprocessing.forkserver has no "
            f"{_SERVER}.{_PRELOAD} list (reader/compat_mp.py)"
        )
