"""TensorFlow's private names that evenshard relies on, and nowhere else.

TensorFlow has no public way to ask whether its runtime has started in this process
(every public call that could tell starts it). ``check()`` says, naming the installed
version, when a release changes that (tests/test_compat.py runs it). Checked with
tensorflow 2.21.0.
"""

from __future__ import annotations

from schemas.errors import OperationError

# the eager context's handle on the runtime: None until the runtime starts
_HANDLE = "_context_handle"


def runtime_started() -> bool:
    """Whether TensorFlow's runtime has started in this process (a process forked after
    that hangs on its first op)."""
    from tensorflow.python.eager import context

    return getattr(context.context(), _HANDLE) is not None


def check() -> None:
    """Raises RuntimeError, naming the name and the installed TensorFlow, unless the
    context still keeps its runtime handle as ``runtime_started`` reads it."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    if not hasattr(context.context(), _HANDLE):
        raise OperationError(
            f"tensorflow {tf.__version__}: the eager context has no {_HANDLE} "
            "(reader/compat_tf.py, checked with 2.21.0)"
        )
