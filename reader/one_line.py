"""A read error in one line: what TensorFlow wraps inside tf.data, unwrapped.

An error raised in a Python function that tf.data calls (the bucket cache's
fetches, the lead's chunks) reaches the caller as a ``tf.errors.OpError`` whose
message is the pipeline's node, the iterator's path, the Python error, then its
traceback. ``one_line`` gives the Python error alone (``FileNotFoundError:
gs://bucket/ds/train-00003-of-00008.tfrecord does not exist``); for any other
error, its first line.
"""

from __future__ import annotations

import re

# "{{function_node ...}} Error in user-defined function passed to X transformation with
# iterator: Iterator::Root::...: " before the error; TensorFlow's own text.
_WRAPPING = re.compile(r"^(?:\{\{function_node [^}]*\}\}\s*)?(?:.*? with iterator: \S+: )?")


def one_line(error: BaseException) -> str:
    """The error's own message in one line (see the module docstring)."""
    text = getattr(error, "message", None) or str(error)
    first = text.strip().split("\n", 1)[0]
    return _WRAPPING.sub("", first).strip() or type(error).__name__
