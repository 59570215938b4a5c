"""Pass-through records (``--record_kind example``): which features to parse, and the parse
of a batch of serialized ``tf.train.Example``s into arrays, with nothing decoded.

The spec is the user's (``Feature`` values, or TensorFlow's ``tf.io.FixedLenFeature``,
``VarLenFeature`` and ``RaggedFeature``), or the dataset's ``schema.pbtxt`` gives one
(``load_spec``): a feature with a ``shape`` (every record holds that many values) is
fixed-length, any other variable-length, as tfx-bsl's ``feature_spec`` makes them.

A batch parses to ``{name: array}``, the same on both routes:

- fixed-length: ``[batch, *shape]`` (int64, float32, or bytes as an object array, as
  TensorFlow's string tensors give them to numpy);
- variable-length: ``Padded(values, lengths)``: ``values`` ``[batch, longest]`` padded
  with 0 (b"" for bytes), ``lengths`` int64 ``[batch]``; a record without the feature
  holds 0 values. A padded array stacks and batches where a list of lists cannot, and a
  framework's own ragged or nested type is one line from it.

``parse_batch`` uses the project's protobuf codec (``schemas.example``: no TensorFlow);
``tf_parse_batch`` is the tf.data route (``tf.io.parse_example``). A fixed-length
feature a record lacks, or holds with another kind or count, is a ``DatasetError``
naming the record and the feature.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from schemas.errors import InvalidTypeError, InvalidValueError
from schemas.info import DatasetError

KINDS = ("int64", "float", "bytes")
_NUMPY = {"int64": np.int64, "float": np.float32, "bytes": object}
_PAD = {"int64": 0, "float": 0.0, "bytes": b""}


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature to parse: its ``kind`` (``int64``, ``float``, ``bytes``) and ``shape``,
    the values of every record (a tuple), or None for a variable number of them."""

    kind: str
    shape: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InvalidValueError(
                f"Feature kind: expected one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if self.shape is not None:
            shape = tuple(self.shape)
            if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
                raise InvalidValueError(
                    f"Feature shape: whole numbers >= 0 expected, got {self.shape}"
                )
            object.__setattr__(self, "shape", tuple(int(d) for d in shape))

    @property
    def size(self) -> int:
        """Values a record of a fixed-length feature holds."""
        return int(np.prod(self.shape, dtype=np.int64))


class Padded(NamedTuple):
    """A variable-length feature of a batch: ``values`` [batch, longest], padded with 0
    (b"" for bytes), and each record's ``lengths`` [batch]."""

    values: object
    lengths: object


def spec_of_schema(schema) -> dict[str, Feature]:
    """The spec of a TFMD ``Schema`` (a ``schema.pbtxt``): a ``shape`` is fixed-length,
    anything else variable."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    kinds = {schema_pb2.INT: "int64", schema_pb2.FLOAT: "float", schema_pb2.BYTES: "bytes"}
    spec = {}
    for f in schema.feature:
        if f.type not in kinds:
            raise DatasetError(f"schema feature {f.name}: type {f.type} is not int, float or bytes")
        shape = tuple(d.size for d in f.shape.dim) if f.HasField("shape") else None
        spec[f.name] = Feature(kinds[f.type], shape)
    return spec


def load_spec(data_dir: str) -> dict[str, Feature]:
    """The spec of a dataset's ``schema.pbtxt`` (local or a URL)."""
    import schemas

    return spec_of_schema(schemas.load(data_dir))


def as_spec(spec: dict) -> dict[str, Feature]:
    """``spec`` as ``Feature`` values: each a ``Feature`` already, or TensorFlow's
    ``tf.io.FixedLenFeature`` (fixed), ``VarLenFeature`` or ``RaggedFeature`` (variable;
    a RaggedFeature's partitions are not taken).

    Raises:
        TypeError: a value that is none of them, or a dtype other than int64, float32
            and string.
    """
    out = {}
    for name, f in spec.items():
        if isinstance(f, Feature):
            out[name] = f
            continue
        kind = {"int64": "int64", "float32": "float", "string": "bytes"}.get(
            getattr(getattr(f, "dtype", None), "name", None)
        )
        ragged = type(f).__name__ == "RaggedFeature" and not getattr(f, "partitions", ())
        if (
            kind is None
            or type(f).__name__ not in ("FixedLenFeature", "VarLenFeature")
            and (not ragged)
        ):
            raise InvalidTypeError(
                f"feature {name!r}: expected a reader.examples.Feature, tf.io.FixedLenFeature, "
                f"VarLenFeature or RaggedFeature of int64, float32 or string, got {f!r}"
            )
        fixed = type(f).__name__ == "FixedLenFeature"
        out[name] = Feature(kind, tuple(f.shape) if fixed else None)
    return out


def parse_batch(records: list[bytes], spec: dict) -> dict:
    """``{name: array or Padded}`` of serialized Examples (module doc), through the
    project's protobuf codec.

    Raises:
        DatasetError: a record that is no Example, or a fixed-length feature it lacks or
            holds with another kind or count (naming the record, from 0, and the feature).
    """
    from schemas.example import parse_features

    spec = as_spec(spec)
    parsed = []
    for i, raw in enumerate(records):
        try:
            parsed.append(parse_features(raw))
        except ValueError as e:
            raise DatasetError(f"record {i} of the batch: {e}") from None
    return {name: _column(name, f, parsed) for name, f in spec.items()}


def _column(name: str, feature: Feature, parsed: list[dict]):
    columns = []
    for i, found in enumerate(parsed):
        kind, values = found.get(name, ("", []))
        if kind and kind != feature.kind:
            raise DatasetError(
                f"record {i} of the batch: feature {name} holds {kind} values, the spec "
                f"says {feature.kind}"
            )
        if feature.shape is not None and (not kind or len(values) != feature.size):
            has = f"{len(values)} values" if kind else "none"
            raise DatasetError(
                f"record {i} of the batch: feature {name}: {feature.size} values expected "
                f"(shape {list(feature.shape)}), {has}"
            )
        columns.append(values)
    dtype = _NUMPY[feature.kind]
    if feature.shape is not None:
        out = np.empty((len(columns), feature.size), dtype)
        for i, values in enumerate(columns):
            out[i] = values
        return out.reshape((len(columns), *feature.shape))
    lengths = np.array([len(v) for v in columns], np.int64)
    values = np.full((len(columns), int(lengths.max(initial=0))), _PAD[feature.kind], dtype)
    for i, v in enumerate(columns):
        values[i, : len(v)] = v
    return Padded(values, lengths)


def tf_spec(spec: dict) -> dict:
    """The ``tf.io.parse_example`` spec of ``spec``: ``FixedLenFeature`` for a fixed
    shape, ``RaggedFeature`` (int64 row lengths) for a variable one."""
    import tensorflow as tf

    dtypes = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}
    return {
        name: (
            tf.io.FixedLenFeature(f.shape, dtypes[f.kind])
            if f.shape is not None
            else tf.io.RaggedFeature(dtypes[f.kind], row_splits_dtype=tf.int64)
        )
        for name, f in as_spec(spec).items()
    }


def tf_parse_batch(serialized, spec: dict) -> dict:
    """``parse_batch`` in TensorFlow, for tf.data: ``serialized`` a string tensor
    [batch]; ``{name: tensor or Padded of tensors}``, the same values and shapes."""
    import tensorflow as tf

    spec = as_spec(spec)
    parsed = tf.io.parse_example(serialized, tf_spec(spec))
    out = {}
    for name, f in spec.items():
        value = parsed[name]
        if f.shape is None:
            pad = tf.constant(_PAD[f.kind], value.dtype)
            value = Padded(value.to_tensor(default_value=pad), value.row_lengths())
        out[name] = value
    return out
