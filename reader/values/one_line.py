"""A read error in one line: what TensorFlow wraps inside tf.data, unwrapped.

An error raised in a Python function that tf.data calls (the bucket cache's
fetches, the lead's chunks) reaches the caller as a ``tf.errors.OpError`` whose
message is the pipeline's node, the iterator's path, the Python error, then its
traceback. ``one_line`` gives the Python error alone (``FileNotFoundError:
gs://bucket/ds/train-00003-of-00008.tfrecord does not exist``); a check of the
readers' own in the graph (a shard corrupt or holding more records than listed,
``reader/records/stream.py``), or a record fetched by place whose check failed, its message
alone; for any other error, its first line.
"""

from __future__ import annotations

import re

# "{{function_node ...}} Error in user-defined function passed to X transformation with
# iterator: Iterator::Root::...: " before the error; TensorFlow's own text.
_WRAPPING = re.compile(r"^(?:\{\{function_node [^}]*\}\}\s*)?(?:.*? with iterator: \S+: )?")

# The first datum of the readers' own tf.debugging.Assert checks, their message the
# second: TensorFlow writes "assertion failed: [evenshard] [<message>]", the message
# C-escaped (a quote in a path as \').
OWN_CHECK = "evenshard"
_OWN = re.compile(rf"^assertion failed: \[{OWN_CHECK}\] \[(.*)\]$")
_ESCAPED = re.compile(r"\\(['\"\\])")


# a DatasetError raised in a Python function tf.data calls (a record fetched by place
# and checked, ``reader.records.record_offsets``): TensorFlow writes its type before it
_RAISED = re.compile(r"^(?:[\w.]+\.)?DatasetError: (.*)$")


def own_message(error: BaseException) -> str | None:
    """The message of a check of the readers' own that failed inside tf.data (see the
    module docstring), else None."""
    first = _first_line(error)
    if found := _OWN.match(first):
        return _ESCAPED.sub(r"\1", found.group(1))
    found = _RAISED.match(first)
    return found.group(1) if found else None


def one_line(error: BaseException) -> str:
    """The error's own message in one line (see the module docstring)."""
    return own_message(error) or _first_line(error) or type(error).__name__


# what a tf.function (Keras' fit) puts before the op's error: a first line, the node, and
# where it was defined (or that it is not known)
_GRAPH = "Graph execution error:"
_GRAPH_LINES = ("Detected at node", "<stack traces", "File ")


def _first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, TensorFlow's wrapping taken off: under a
    tf.function's "Graph execution error:", the first line of the op's own error."""
    lines = (getattr(error, "message", None) or str(error)).strip().split("\n")
    if lines[0].strip() == _GRAPH:
        lines = [line for line in lines[1:] if line.strip()] or lines
        lines = [line for line in lines if not line.strip().startswith(_GRAPH_LINES)] or lines
    return _WRAPPING.sub("", lines[0].strip()).strip()
