"""reader.examples: a batch of real tf.train.Examples parsed into arrays, by the project's
codec and by tf.io.parse_example, against the values written; the spec from a schema
as tfx-bsl makes it."""

from __future__ import annotations

import numpy as np
import pytest
from test_pass_through import example, mixed

import schemas
from reader.examples import (
    Feature,
    Padded,
    as_spec,
    parse_batch,
    spec_of_schema,
    tf_parse_batch,
)
from schemas import inferred
from schemas.example import parse_features
from schemas.info import DatasetError


def _schema_of(records: list[bytes]):
    stats: dict = {}
    for r in records:
        inferred.add(stats, parse_features(r))
    return inferred.infer_schema(stats, len(records))


def _written(records: list[bytes]) -> list[dict]:
    import tensorflow as tf

    out = []
    for r in records:
        found = {}
        for name, f in tf.train.Example.FromString(r).features.feature.items():
            found[name] = list(getattr(f, f.WhichOneof("kind")).value)
        out.append(found)
    return out


def _same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, value in got.items():
        want = expected[name]
        if isinstance(want, Padded):
            assert isinstance(value, Padded), name
            np.testing.assert_array_equal(np.asarray(value.values), np.asarray(want.values))
            np.testing.assert_array_equal(np.asarray(value.lengths), np.asarray(want.lengths))
        else:
            np.testing.assert_array_equal(np.asarray(value), np.asarray(want))


def test_a_batch_parses_to_the_values_written_on_both_routes():
    import tensorflow as tf

    records = mixed(9)
    spec = spec_of_schema(_schema_of(records))
    assert spec["embedding"] == Feature("float", (3,))
    assert spec["tokens"] == Feature("int64") and spec["weight"] == Feature("float")
    got = parse_batch(records, spec)
    for i, values in enumerate(_written(records)):
        for name, f in spec.items():
            if f.shape is not None:
                row = got[name][i].reshape(-1).tolist()
                assert row == values[name]  # float32 values, exactly
            else:
                n = int(got[name].lengths[i])
                assert got[name].values[i, :n].tolist() == values.get(name, [])
                assert all(v in (0, b"") for v in got[name].values[i, n:].tolist())
    assert got["embedding"].dtype == np.float32 and got["tokens"].values.dtype == np.int64
    assert got["id"].dtype == object and got["id"].shape == (9, 1)
    assert got["weight"].lengths.tolist() == [1, 0, 0, 1, 0, 0, 1, 0, 0]
    # tf.data's route: the same arrays
    parsed = tf_parse_batch(tf.constant(records), spec)
    _same(
        {
            k: v.numpy() if tf.is_tensor(v) else Padded(*(t.numpy() for t in v))
            for k, v in parsed.items()
        },
        got,
    )


def test_the_schemas_spec_is_tfx_bsls():
    records = mixed(6)
    schema = _schema_of(records)
    ours = spec_of_schema(schema)
    theirs = schemas.feature_spec(schema)  # tfx-bsl's
    assert ours.keys() == theirs.keys()
    for name, f in ours.items():
        kind = type(theirs[name]).__name__
        assert kind == ("FixedLenFeature" if f.shape is not None else "VarLenFeature"), name
        assert as_spec({name: theirs[name]})[name].kind == f.kind


def test_a_users_tf_spec_picks_features():
    import tensorflow as tf

    records = mixed(4)
    spec = {
        "embedding": tf.io.FixedLenFeature([3], tf.float32),
        "tags": tf.io.RaggedFeature(tf.string),
        "tokens": tf.io.VarLenFeature(tf.int64),
    }
    got = parse_batch(records, spec)
    assert sorted(got) == ["embedding", "tags", "tokens"]
    assert got["tags"].lengths.tolist() == [1, 2, 3, 1]
    assert got["tags"].values[2].tolist() == [b"t0", b"t1", b"t2"]
    with pytest.raises(TypeError, match="'x'"):
        as_spec({"x": tf.io.FixedLenFeature([], tf.uint8)})


def test_a_record_that_breaks_the_spec_is_one_error_naming_it():
    good = example(id="a", x=np.array([1, 2]))
    spec = {"id": Feature("bytes", (1,)), "x": Feature("int64", (2,))}
    with pytest.raises(DatasetError, match="record 1 of the batch: feature x: 2 values"):
        parse_batch([good, example(id="b", x=3)], spec)
    with pytest.raises(DatasetError, match="record 1 of the batch: feature id: .*none"):
        parse_batch([good, example(x=np.array([1, 2]))], spec)
    with pytest.raises(DatasetError, match="record 0 of the batch: feature x holds bytes"):
        parse_batch([example(id="c", x="text")], spec)
    with pytest.raises(DatasetError, match="record 0 of the batch: not a tf.train.Example"):
        parse_batch([b"\xff\xff"], spec)
    with pytest.raises(ValueError, match="kind"):
        Feature("uint8")


def test_an_empty_or_missing_variable_feature_is_length_zero():
    records = [example(id="a"), example(id="b", x=np.array([], np.int64))]
    got = parse_batch(records, {"x": Feature("int64")})
    assert got["x"].values.shape == (2, 0) and got["x"].lengths.tolist() == [0, 0]


def test_the_inferred_schema_agrees_with_tfx_bsls_decoder():
    """Types from tfx-bsl's own decoding (its arrow schema, no schema given), presence
    from its nulls, value counts from its list lengths: the schema inferred says the
    same."""
    import pyarrow as pa
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder

    records = mixed(10) + [example(id="x", label="cat", tokens=np.array([], np.int64))]
    batch = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(records)
    schema = {f.name: f for f in _schema_of(records).feature}
    assert sorted(schema) == sorted(batch.schema.names)
    types = {pa.int64(): schema_pb2.INT, pa.float32(): schema_pb2.FLOAT}
    for name in batch.schema.names:
        column = batch.column(batch.schema.get_field_index(name))
        assert schema[name].type == types.get(column.type.value_type, schema_pb2.BYTES), name
        every = column.null_count == 0
        assert (schema[name].presence.min_fraction == 1.0) == every, name
        lengths = [len(v) for v in column.to_pylist() if v is not None]
        if schema[name].HasField("shape"):
            assert set(lengths) == {schema[name].shape.dim[0].size}, name
        else:
            vc = schema[name].value_count
            assert (vc.min, vc.max) == (min(lengths), max(lengths)), name
