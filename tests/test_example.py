"""Our Example encoder gives exactly TensorFlow's deterministic bytes."""

from __future__ import annotations

import pytest
import tensorflow as tf

from schemas.example import serialize_example

pytestmark = pytest.mark.fast  # the unit lane: make test-fast

CASES = [
    {
        "image/encoded": b"\xff\xd8\xff" + bytes(range(256)) * 3,
        "image/class/label": 0,
        "image/key": "cat/001.jpg",
        "image/height": 480,
        "image/width": 2**40,
    },
    {
        "image/path": "ünïcode/фото.png",
        "image/class/text": "日本",
        "image/class/label": 127,
        "image/channels": 128,
        "image/format": "png",
    },
    {"a": b"", "b": -1, "B": -(2**63), "aa": 2**63 - 1, "é": "x"},
]


@pytest.mark.parametrize("features", CASES)
def test_matches_tensorflow(features):
    def feature(v):
        if isinstance(v, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        v = v.encode() if isinstance(v, str) else v
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    example = tf.train.Example(
        features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
    )
    assert serialize_example(features) == example.SerializeToString(deterministic=True)
    assert tf.train.Example.FromString(serialize_example(features)) == example


def test_rejects_other_types():
    with pytest.raises(TypeError):
        serialize_example({"x": 1.5})


@pytest.mark.parametrize("kind,payload", [("image", b"\x89PNG..."), ("path", "cat/001.png")])
def test_encode_record_writes_every_feature_of_its_kind_once(kind, payload):
    import schemas
    from schemas.example import encode_record

    record = encode_record(
        kind,
        key="cat/001.png",
        label="cat",
        label_id=1,
        image_format="png",
        height=4,
        width=5,
        channels=3,
        payload=payload,
    )
    feature = tf.train.Example.FromString(record).features.feature
    assert set(feature) == {f.name for f in schemas.base_schema(kind).feature}
    assert feature["image/class/label"].int64_list.value == [1]
    value = payload.encode() if isinstance(payload, str) else payload
    other = "image/path" if kind == "image" else "image/encoded"
    assert feature[f"image/{'encoded' if kind == 'image' else 'path'}"].bytes_list.value == [value]
    assert other not in feature
