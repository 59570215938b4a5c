"""``make_dataset``: a tf.data pipeline over one split of an evenshard dataset.

The tf.data face: an adapter over the spine (docs/design.md, "One spine"): what
to read (``reader.front.read.resolve``), then the tf graph stream (``reader.routes.graph``), or,
with a Python ``transform``, views or ``on_error="skip"``, the Python route's batches
(``reader.routes.python_route``) through ``tf.data.Dataset.from_generator``. ``resume`` is
the form that also gives the state to advance.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from reader.examples import Padded
from reader.front.read import check_sized, check_state, merge, resolve
from reader.records import tfcall
from reader.routes import graph
from reader.routes.python_route import PythonRoute
from reader.values.mixture import Mixture
from reader.values.option_groups import GROUPS, PythonStage, refuse_untaken
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas import storage
from schemas.errors import InvalidTypeError, InvalidValueError, OperationError

tf = storage.tensorflow()

# the groups of options the Python route of this face takes (reader/values/option_groups.py);
# the tf graph takes them all (on_error="raise" there: a record that fails stops it)
PYTHON_TAKES = frozenset(GROUPS) - {"form", "device"}
# the Python route's keywords make_dataset and resume take (a PythonStage's fields)
PYTHON = tuple(f.name for f in dataclasses.fields(PythonStage))
INSTEAD = {
    "form": "with transform= or views=, the dataset yields the transform's dicts: map "
    "them to (image, label) yourself",
    "device": 'with transform=, views= or on_error="skip", batches come from Python: '
    "move them with tf.data.experimental.prefetch_to_device yourself",
}


def make_dataset(
    data_dir: str | Mixture,
    split: str = "train",
    batch_size: int | None = 32,
    options: ReadOptions | None = None,
    *,
    state: ReadState | None = None,
    transform=None,
    views: int = 1,
    view_spread: int | str = "together",
    mirror_views: bool = False,
    num_processes: int | None = None,
    **overrides,
):
    """Builds a ``tf.data.Dataset`` over one split, from ``dataset_info.json``.

    Args:
        data_dir: a folder written by ``evenshard convert`` (local or gs://), or a
            ``reader.mix`` of several splits (then ``split`` is not used).
        split: split name.
        batch_size: examples a batch; None yields single examples.
        options: a :class:`ReadOptions`; default ``ReadOptions()``.
        state: deprecated: ``dataset, state = reader.resume(data_dir, split, state)``
            (this form returns that pair, with a ``DeprecationWarning``).
        **overrides: fields of ``ReadOptions`` to change, e.g. ``seed=0,
            image_size=(224, 224)``.
        transform, views, view_spread, mirror_views, num_processes: a Python
            ``transform(example, rng)`` run in ``num_processes`` worker processes on each
            image decoded once, ``views`` times, the views of an image together in a
            batch or, with ``view_spread=D``, D batches apart: the batches of
            :class:`reader.NumpyReader` as a dataset (``tf.data.Dataset.from_generator``).
            The transform's values must be arrays, numbers or strings. Views spread are
            not resumed from a ``ReadState`` (it cannot say where a read stands between
            an image's views: ``NumpyReader``'s ``state_dict()`` can).
            ``on_error="skip"`` (with ``error_ledger``) reads that route too, without a
            transform: ``NumpyReader``'s batches, a record that cannot be read a padding
            row (``mask`` False) written to the ledger.

    Returns:
        A dataset of dicts ``{"image", "label", "key"}`` (plus ``"mask"`` with
        ``pad_final_batch`` or a state's excluded keys; the Python route's dicts add
        ``"view"`` and ``"epoch"`` and always hold ``"mask"``), or (image, label)
        tuples ((image, label, weight) where rows are masked); finite datasets carry
        their cardinality.

    Raises:
        DatasetError: the dataset is missing, unfinished, or a listed shard is
            missing or has the wrong size; when the dataset is iterated, a shard
            whose records turn out corrupt (inside a ``tf.function``, or from a
            dataset mapped further: ``tf.errors.InvalidArgumentError``, which
            ``reader.one_line`` gives as the same line).
        ValueError: options that do not fit together.
    """
    python = PythonStage(transform, views, view_spread, mirror_views, num_processes)
    if state is None:
        return _read(data_dir, split, batch_size, options, None, python, overrides)[0]
    warnings.warn(
        "make_dataset(..., state=state) returning (dataset, state) is deprecated and goes "
        "in the next release: write dataset, state = reader.resume(data_dir, split, state, "
        "batch_size=batch_size, ...); make_dataset returns the dataset alone",
        DeprecationWarning,
        stacklevel=2,
    )
    return _read(data_dir, split, batch_size, options, state, python, overrides)


def _read(data_dir, split, batch_size, options, state, python: PythonStage, overrides: dict):
    """(dataset, the state to advance: None when given none) of a read: the graph
    stream, or the Python route's batches when ``python`` needs it (a transform, views,
    or records skipped one by one: docs/design.md, "A record that cannot be read")."""
    options = merge(options, overrides)
    check_state(state)
    if python.route(options.on_error) == "python":
        return _preprocessed(data_dir, split, batch_size, options, state, python)
    read = resolve(data_dir, split, batch_size, options, state)
    check_sized(options, batch_size, read)
    return graph.dataset(read, resumed=state is not None), read.state


def _preprocessed(data_dir, split, batch_size, o, state, python: PythonStage):
    """``make_dataset`` with a Python transform, views or ``on_error="skip"``: the Python
    route's batches as a dataset, each pass over it a new pass of the read (Keras
    iterates once an epoch). Without a transform or views, ``as_supervised`` gives
    (image, label, weight): a masked row weighs 0."""
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
    batches = iter(route)
    first = next(batches)  # the signature: the transform's fields, types and shapes

    def signature(name, value):
        if isinstance(value, Padded):  # records that are not images: a variable length
            lengths = signature(name, value.lengths)
            return Padded(tf.TensorSpec((None, None), signature(name, value.values).dtype), lengths)
        if isinstance(value, np.ndarray) and value.dtype == object:  # bytes features
            return tf.TensorSpec((None, *value.shape[1:]), tf.string)
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return tf.TensorSpec((None, *value.shape[1:]), value.dtype)
        if isinstance(value, list) and all(isinstance(v, (str, bytes)) for v in value):
            return tf.TensorSpec((None,), tf.string)
        held = " and ".join(sorted({type(v).__name__ for v in value})) + " values"
        shapes = sorted({v.shape for v in value if isinstance(v, np.ndarray)})
        if held == "ndarray values" and len(shapes) > 1:
            held = f"arrays of {len(shapes)} shapes ({', '.join(map(str, shapes[:3]))})"
        raise InvalidTypeError(
            f"transform output {name!r} holds {held}: make_dataset yields "
            "tensors (arrays of one shape, numbers or strings); reader.NumpyReader "
            "yields any values"
        )

    spec = {name: signature(name, value) for name, value in first.items()}

    def same(batch: dict) -> dict:
        """``batch``, its fields of the first batch's types: TensorFlow would cast a
        float field to a first batch's ints (0.5 read as 0)."""
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

    def generate():
        nonlocal first, batches
        try:
            if first is not None:  # the pass begun for the signature
                head, rest = first, batches
                first = batches = None
                yield head
                yield from map(same, rest)
            else:
                yield from map(same, route)
        except KeyboardInterrupt:  # Ctrl-C reached the read's processes; the read ended
            # The caller may wait inside TensorFlow, its own Ctrl-C pending there: an
            # error from here would race it (TensorFlow then raises a RuntimeError), an
            # empty batch lets it out to raise it. Had it no Ctrl-C, it sees the batch,
            # then this error.
            yield tf.nest.map_structure(
                lambda s: np.zeros((0, *[d or 0 for d in s.shape[1:]]), s.dtype.as_numpy_dtype),
                spec,
            )
            raise OperationError("the read was interrupted (Ctrl-C)") from None

    ds = tf.data.Dataset.from_generator(generate, output_signature=spec)
    try:
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(route)))
    except TypeError:  # endless
        pass
    if plain and o.as_supervised:  # Keras takes a third element as sample weights
        ds = ds.map(
            tfcall.graph(lambda b: (b["image"], b["label"], tf.cast(b["mask"], tf.float32)))
        )
    ds = ds.with_options(graph.tf_options(None))
    ds = ds.prefetch(o.prefetch) if o.prefetch is not None else ds
    return ds, start


def resume(data_dir: str, split: str, state: ReadState, options=None, **overrides):
    """A dataset that continues a seeded read from ``state``, and the state to advance
    (``reader.make_dataset``'s dataset, from the state's position).

    With the worker count of the run that saved it, the dataset yields exactly the
    batches the uninterrupted read would have yielded from ``state.step`` on (same
    keys, order, crops, padding and mask), without reading or decoding what it skips.
    With another worker count, the new workers first read, between them, exactly what
    the old ones had left of the epochs they had started (each such record once),
    then their own order from the next epoch (docs/design.md, "Elastic resume").

    Args:
        data_dir, split, options, overrides: as for ``reader.make_dataset``
            (``batch_size`` may be given to change it; ``seed`` comes from the state).
        state: a :class:`ReadState` (new, or from ``ReadState.from_json``).

    Returns:
        (dataset, state): advance the state by the batches consumed and save it.
    """
    check_state(state)
    batch_size = overrides.pop("batch_size", state.batch_size)
    python = PythonStage(**{name: overrides.pop(name) for name in PYTHON if name in overrides})
    return _read(data_dir, split, batch_size, options, state, python, overrides)
