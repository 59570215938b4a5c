"""Python functions called from tf.data's threads, and a clean exit while they run.

A tf.data iterator still alive when Python exits (a global ``it``, a script that
stopped on an error) is destroyed while Python finalizes, holding the GIL; a
background thread inside a ``numpy_function`` then waits for the GIL forever, and
the process hangs instead of exiting. It happened after a read error, while the
prefetch thread was still filling its buffer with the next runs' errors. Every
Python call of the readers goes through :func:`call`, which counts the calls in
flight; at exit, before Python finalizes, :func:`_settle` waits (GIL released)
until none has run for a moment, so the threads are idle when their iterators go.
"""

from __future__ import annotations

import atexit
import threading
import time

from schemas import storage

tf = storage.tensorflow()

QUIET_S = 0.25  # no call in flight or begun for this long: the threads are idle
SETTLE_MAX_S = 10.0  # the longest an exit waits for them

_lock = threading.Lock()
_running = 0
_last = 0.0


def call(fn, inputs: list, types, stateful: bool = False):
    """``tf.numpy_function(fn, inputs, types)``, counted for a clean exit."""

    def counted(*args):
        global _running, _last
        with _lock:
            _running += 1
        try:
            return fn(*args)
        finally:
            with _lock:
                _running -= 1
                _last = time.monotonic()

    return tf.numpy_function(counted, inputs, types, stateful=stateful)


def graph(fn):
    """``fn`` as tf.data traces it, without AutoGraph's rewrite: the readers' functions
    build graphs with TensorFlow ops alone (``tf.cond``, no Python ``if`` on a tensor),
    and AutoGraph's source transformation of them cost 1.9 s of the first
    ``make_dataset`` of a process (2.1 s in all)."""
    return tf.autograph.experimental.do_not_convert(fn)


def _settle(quiet: float = QUIET_S, limit: float = SETTLE_MAX_S) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        with _lock:
            idle = _running == 0 and time.monotonic() - _last > quiet
        if idle:
            return
        time.sleep(0.02)


atexit.register(_settle)
