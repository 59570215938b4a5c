"""TensorFlow's private names that evenshard relies on, and nowhere else.

TensorFlow has no public way to ask whether its runtime has started in this process
(every public call that could tell starts it), nor to give a dataset's Python
iterators a behaviour of their own (``errors_as``). ``check()`` says,
naming the installed version, when a release changes that (tests/test_compat.py
runs it). Checked with tensorflow 2.21.0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from schemas.errors import OperationError

# the eager context's handle on the runtime: None until the runtime starts
_HANDLE = "_context_handle"


def runtime_started() -> bool:
    """Whether TensorFlow's runtime has started in this process (a process forked after
    that hangs on its first op)."""
    from tensorflow.python.eager import context

    return getattr(context.context(), _HANDLE) is not None


def errors_as(dataset, translate: Callable[[Exception], Exception | None]):
    """``dataset`` itself (the same graph, no op added) whose eager iterators
    (``for``, ``next()``, ``get_next()``) raise ``translate(error)`` in place of an
    error of the read that it gives an exception for (None: the error as it is)."""
    return _errors_as_class()(dataset, dataset._variant_tensor, translate)


@functools.cache
def _errors_as_class() -> type:
    """The class of ``errors_as``: TensorFlow's base of a dataset that yields its input's
    elements, whose eager iterator is its ``OwnedIterator``; that iterator's
    ``_next_internal`` serves ``next()`` and ``get_next()`` alike."""
    import tensorflow as tf
    from tensorflow.python.data.ops import dataset_ops, iterator_ops

    class Iterator(iterator_ops.OwnedIterator):
        def __init__(self, dataset, translate):
            self._translate = translate
            super().__init__(dataset)

        def _next_internal(self):
            try:
                return super()._next_internal()
            except tf.errors.OutOfRangeError:  # the end: StopIteration
                raise
            except tf.errors.OpError as e:
                translated = self._translate(e)
                if translated is None:
                    raise
                raise translated from None

    class ErrorsAs(dataset_ops.UnaryUnchangedStructureDataset):
        def __init__(self, dataset, variant, translate):
            self._translate = translate
            super().__init__(dataset, variant)

        def __iter__(self):
            if not tf.executing_eagerly():  # inside a tf.function: errors are the graph's
                return super().__iter__()
            with tf.device(self._variant_tensor.device):  # as TensorFlow places its own
                return Iterator(self, self._translate)

    return ErrorsAs


def check() -> None:
    """Raises RuntimeError, naming the name and the installed TensorFlow, unless the
    context still keeps its runtime handle as ``runtime_started`` reads it and the
    names ``errors_as`` uses are there."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    def missing(what: str) -> OperationError:
        return OperationError(
            f"tensorflow {tf.__version__}: {what} (reader/compat/tf.py, checked with 2.21.0)"
        )

    if not hasattr(context.context(), _HANDLE):
        raise missing(f"the eager context has no {_HANDLE}")
    try:
        _errors_as_class()
    except (ImportError, AttributeError) as e:
        raise missing(str(e)) from None
    from tensorflow.python.data.ops import iterator_ops

    if not hasattr(iterator_ops.OwnedIterator, "_next_internal"):
        raise missing("OwnedIterator has no _next_internal")
    if not hasattr(tf.data.Dataset.range(1), "_variant_tensor"):
        raise missing("a dataset has no _variant_tensor")
