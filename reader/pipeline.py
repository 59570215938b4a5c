"""``make_dataset``: a tf.data pipeline over one split of an evenshard dataset.

The tf.data face: an adapter over the spine (docs/design.md, "One spine"): what
to read (``reader.front.read.resolve``), then the tf graph stream
(``reader.routes.graph``), or, with a Python ``transform``, views, ``num_processes`` or
``on_error="skip"``, the Python route's batches (``reader.routes.python_route``) as a
dataset (``reader.routes.tf_adapter``). ``resume`` is the form that also gives the state
to advance.
"""

from __future__ import annotations

import dataclasses
import warnings

from reader.front.read import check_sized, check_state, merge, resolve
from reader.routes import graph, tf_adapter
from reader.values.mixture import Mixture
from reader.values.option_groups import PythonStage
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState

# the Python route's keywords make_dataset and resume take (a PythonStage's fields)
PYTHON = tuple(f.name for f in dataclasses.fields(PythonStage))


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
            ``num_processes`` alone reads that route too (the engine), and
            ``on_error="skip"`` (with ``error_ledger``) does, without a
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
        return tf_adapter.dataset(data_dir, split, batch_size, options, state, python)
    read = resolve(data_dir, split, batch_size, options, state)
    check_sized(options, batch_size, read)
    return graph.dataset(read, resumed=state is not None), read.state


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
