"""The Python route's batches as a ``tf.data.Dataset`` (``tf.data.Dataset.from_generator``):
``make_dataset`` with a Python ``transform``, views or ``on_error="skip"``. The dataset's
signature is the first batch's fields, types and shapes; each pass over the dataset is
a new pass of the read (Keras iterates once an epoch)."""

from __future__ import annotations

import threading
import weakref

import numpy as np

from reader.examples import Padded
from reader.routes import graph
from reader.routes.python_route import PythonRoute
from reader.values.option_groups import GROUPS, PythonStage, refuse_untaken
from reader.values.state import ReadState
from schemas import storage
from schemas.errors import InvalidTypeError, InvalidValueError, OperationError

tf = storage.tensorflow()

# the groups of options the Python route of make_dataset takes (reader/values/option_groups.py);
# the tf graph takes them all (on_error="raise" there: a record that fails stops it)
PYTHON_TAKES = frozenset(GROUPS) - {"form", "device"}
INSTEAD = {
    "form": "with transform= or views=, the dataset yields the transform's dicts: map "
    "them to (image, label) yourself",
    "device": 'with transform=, views= or on_error="skip", batches come from Python: '
    "move them with tf.data.experimental.prefetch_to_device yourself",
}


def dataset(data_dir, split, batch_size, o, state, python: PythonStage):
    """(dataset, the state to advance) of the Python route's read: its batches as a
    dataset. Without a transform or views, ``as_supervised`` gives (image, label) as the
    graph's, and (image, label, weight) where a row can be masked (``pad_final_batch``,
    a state's excluded keys, ``on_error="skip"``): a masked row weighs 0."""
    plain = python.transform is None and python.views == 1  # on_error="skip" alone
    face = 'make_dataset(on_error="skip")' if plain else "make_dataset(transform=...)"
    if batch_size is None:
        raise InvalidValueError(f"{face} reads the Python route's batches: give batch_size")
    refuse_untaken(o, PYTHON_TAKES | {"form"} if plain else PYTHON_TAKES, face, INSTEAD)
    route = PythonRoute(data_dir, split, batch_size, o, state=state, stage=python)
    if state is not None and route.spread is not None:
        # the state handed back is advanced by batches, which then count views of
        # blocks: a ReadState has no view_skip to say how far into a block's views
        raise InvalidValueError(
            "make_dataset(view_spread=...) is not resumed from a ReadState, which cannot "
            "say where a read stands between an image's views: resume views spread with "
            "reader.NumpyReader's state_dict() and load_state_dict(), or read with "
            'views together (view_spread="together")'
        )
    start = ReadState.from_json(route.state_dict()["read_state"])
    begun = _Begun(iter(route))  # the signature: the transform's fields, types and shapes
    first = begun.first
    # every batch batch_size rows where no final batch is partial, as the graph's (a
    # record skipped with on_error="skip" is a masked padding row in place: its batch full)
    full = o.drop_remainder or o.pad_final_batch
    rows = batch_size if full else None
    spec = {name: _signature(name, value, rows) for name, value in first.items()}

    def generate():
        try:
            taken = begun.take()
            if taken is not None:  # the pass begun for the signature
                head, rest = taken
                yield head
                yield from (_same(spec, batch) for batch in rest)
            else:
                yield from (_same(spec, batch) for batch in route)
        except KeyboardInterrupt:  # Ctrl-C reached the read's processes; the read ended
            # The caller may wait inside TensorFlow, its own Ctrl-C pending there: an
            # error from here would race it (TensorFlow then raises a RuntimeError), an
            # empty batch lets it out to raise it. Had it no Ctrl-C, it sees the batch,
            # then this error. Where the spec fixes the batch's rows, a batch of them
            # (zeros, masked: padding rows), as an empty one would break the spec.
            yield tf.nest.map_structure(_stand_in, spec)
            raise OperationError("the read was interrupted (Ctrl-C)") from None

    ds = tf.data.Dataset.from_generator(generate, output_signature=spec)
    try:
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(route)))
    except TypeError:  # endless
        pass
    if plain and o.as_supervised:
        masked = o.pad_final_batch or o.on_error == "skip" or bool(state and state.excluded)
        ds = graph.supervised(ds, weighted=bool(masked))
    ds = ds.with_options(graph.tf_options(None))
    ds = ds.prefetch(o.prefetch) if o.prefetch is not None else ds
    # a dataset dropped unread ends the pass begun (its processes, its shared blocks):
    # TensorFlow's registry of generators would hold it to the exit
    weakref.finalize(ds, begun.close)
    return ds, start


def _stand_in(s):
    """A field of the batch yielded at Ctrl-C: no rows, or the spec's where it fixes
    them (zeros; empty strings)."""
    shape = [d or 0 for d in s.shape]
    if s.dtype == tf.string:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, s.dtype.as_numpy_dtype)


class _Begun:
    """The pass begun for a dataset's signature (its first batch read), until the
    dataset's first iteration takes it, or the dataset is dropped (``close``)."""

    def __init__(self, batches):
        self.first = next(batches)
        self._batches = batches
        self._lock = threading.Lock()  # the finalizer may run in another thread

    def take(self):
        """(first batch, the rest of its pass), once; then None."""
        with self._lock:
            if self._batches is None:
                return None
            taken, self.first, self._batches = (self.first, self._batches), None, None
            return taken

    def close(self) -> None:
        with self._lock:
            batches, self.first, self._batches = self._batches, None, None
        if batches is not None:
            batches.close()


def _signature(name: str, value, rows: int | None = None):
    """The tensor spec of a batch's field ``name``, ``rows`` rows (None: any)."""
    if isinstance(value, Padded):  # records that are not images: a variable length
        lengths = _signature(name, value.lengths, rows)
        values = _signature(name, value.values, rows)
        return Padded(tf.TensorSpec((rows, None), values.dtype), lengths)
    if isinstance(value, np.ndarray) and value.dtype == object:  # bytes features
        return tf.TensorSpec((rows, *value.shape[1:]), tf.string)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return tf.TensorSpec((rows, *value.shape[1:]), value.dtype)
    if isinstance(value, list) and all(isinstance(v, (str, bytes)) for v in value):
        return tf.TensorSpec((rows,), tf.string)
    held = " and ".join(sorted({type(v).__name__ for v in value})) + " values"
    shapes = sorted({v.shape for v in value if isinstance(v, np.ndarray)})
    fix = "; reader.NumpyReader yields any values"
    if held == "ndarray values" and len(shapes) > 1:
        held = f"arrays of {len(shapes)} shapes ({', '.join(map(str, shapes[:3]))})"
        fix = (  # images decoded at their own sizes, most likely
            ": return one shape (resize or crop in the transform), or give "
            "image_size=(height, width) to decode every image at one size before it"
        )
    raise InvalidTypeError(
        f"transform output {name!r} holds {held}: make_dataset yields "
        f"tensors (arrays of one shape, numbers or strings){fix}"
    )


def _same(spec: dict, batch: dict) -> dict:
    """``batch``, its fields of the first batch's types (``spec``): TensorFlow would cast
    a float field to a first batch's ints (0.5 read as 0)."""
    for name, s in spec.items():
        value = batch[name]
        if isinstance(s, Padded):  # parsed records: their spec's types, every batch
            continue
        if s.dtype == tf.string or (
            isinstance(value, np.ndarray)
            and np.can_cast(value.dtype, s.dtype.as_numpy_dtype, "same_kind")
        ):
            continue
        held = (
            value.dtype.name
            if isinstance(value, np.ndarray)
            else " and ".join(sorted({type(v).__name__ for v in value})) + " values"
        )
        raise InvalidTypeError(
            f"transform output {name!r} holds {held} in the batch of key "
            f"{batch['key'][0]!r}, {s.dtype.name} in the first batch: make_dataset "
            "yields one type a field; return the same type for every example "
            "(1.0, not 1, where others are 0.5)"
        )
    return batch
