"""tf.train.Example serialization without importing TensorFlow.

The shard writer only ever builds one shape of Example: a map of features,
each holding a single bytes or int64 value. Encoding that in the protobuf
wire format directly keeps TensorFlow (seconds of import, hundreds of MB) out
of every Beam worker. The bytes are those of
``tf.train.Example.SerializeToString(deterministic=True)``: map entries in
key order, int64 values packed; tests/test_example.py pins the
equality against TensorFlow itself.

Wire format (tensorflow/core/example/{example,feature}.proto):
  Example  { Features features = 1; }
  Features { map<string, Feature> feature = 1; }  entry { key = 1; value = 2; }
  Feature  { BytesList bytes_list = 1; Int64List int64_list = 3; }
  BytesList { repeated bytes value = 1; }   Int64List { repeated int64 value = 1 [packed]; }
"""

from __future__ import annotations

import functools

from schemas import features
from schemas.errors import InvalidTypeError, InvalidValueError

_ONE_BYTE = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:  # tags, most lengths and small ints: the hot path
        return _ONE_BYTE[n]
    if n < 0:
        n += 1 << 64  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def length_delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2): tag, length, ``payload``."""
    return _field(number, payload)


def _map_order(name: str) -> list[int]:
    """Protobuf's deterministic map order: bytewise, but a key before its own prefix.

    (upb compares the common prefix, then puts the longer key first: "aa" < "a".)
    """
    return [*name.encode("utf-8"), 256]


@functools.lru_cache(maxsize=1024)
def _key_field(name: str) -> bytes:
    return _field(1, name.encode("utf-8"))


@functools.lru_cache(maxsize=64)
def _order(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(names, key=_map_order))


def _vlen(n: int) -> int:
    """Bytes of the varint of ``n`` >= 0."""
    return 1 if n < 128 else (n.bit_length() + 6) // 7


def serialize_example(features: dict[str, bytes | str | int]) -> bytes:
    """Serializes ``{name: single value}`` exactly as TF's deterministic serializer does.

    Lengths are computed first and every piece joined once at the end, so
    an image payload is copied once (nesting it field by field copied it
    five times: most of the writer's encoding time).
    """
    pieces = []
    body = 0
    for name in _order(tuple(features)):
        value = features[name]
        key = _key_field(name)
        if isinstance(value, bool) or not isinstance(value, (bytes, str, int)):
            raise InvalidTypeError(
                f"feature values are bytes, str or int, got {type(value).__name__}"
            )
        if isinstance(value, int):
            v = _varint(value)
            inner = b"\x0a" + _ONE_BYTE[len(v)] + v  # Int64List.value, packed
            feature = b"\x1a" + _ONE_BYTE[len(inner)] + inner  # Feature.int64_list
            entry = key + b"\x12" + _varint(len(feature)) + feature
            head, tail = b"\x0a" + _varint(len(entry)) + entry, b""
        else:
            if isinstance(value, str):
                value = value.encode("utf-8")
            n = len(value)
            inner = 1 + _vlen(n) + n  # BytesList.value
            feature = 1 + _vlen(inner) + inner  # Feature.bytes_list
            entry = len(key) + 1 + _vlen(feature) + feature
            head = b"".join(
                [
                    b"\x0a",
                    _varint(entry),
                    key,
                    b"\x12",
                    _varint(feature),
                    b"\x0a",
                    _varint(inner),
                    b"\x0a",
                    _varint(n),
                ]
            )
            tail = value
        pieces += (head, tail)
        body += len(head) + len(tail)
    return b"".join([b"\x0a", _varint(body), *pieces])


def encode_record(
    kind: str,
    *,
    key: str,
    label: str,
    label_id: int,
    image_format: str,
    height: int,
    width: int,
    channels: int,
    payload: bytes | str,
) -> bytes:
    """The serialized tf.train.Example of one evenshard record.

    Args:
        kind: ``image`` (``payload`` is the encoded image) or ``path``
            (``payload`` is the path relative to path_root).
    """
    return serialize_example(
        {
            features.FORMAT: image_format,
            features.HEIGHT: height,
            features.WIDTH: width,
            features.CHANNELS: channels,
            features.LABEL: label_id,
            features.TEXT: label,
            features.KEY: key,
            features.payload(kind): payload,
        }
    )


@functools.lru_cache(maxsize=1)
def _example_class():
    """tf.train.Example as a protobuf class built here, in a pool of its own (parsing
    in C through protobuf's upb, without importing TensorFlow)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="evenshard/example.proto", package="evenshard", syntax="proto3"
    )

    def message(name, *fields, nested=()):
        m = fd.message_type.add(name=name)
        for number, fname, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
        for n in nested:
            m.nested_type.add().CopyFrom(n)
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", (1, "value", F.TYPE_BYTES, rep, None))
    message("Int64List", (1, "value", F.TYPE_INT64, rep, None))
    message("FloatList", (1, "value", F.TYPE_FLOAT, rep, None))
    feature = message(
        "Feature",
        (1, "bytes_list", F.TYPE_MESSAGE, opt, ".evenshard.BytesList"),
        (2, "float_list", F.TYPE_MESSAGE, opt, ".evenshard.FloatList"),
        (3, "int64_list", F.TYPE_MESSAGE, opt, ".evenshard.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(
        name="value", number=2, type=F.TYPE_MESSAGE, label=opt, type_name=".evenshard.Feature"
    )
    message(
        "Features",
        (1, "feature", F.TYPE_MESSAGE, rep, ".evenshard.Features.FeatureEntry"),
        nested=[entry],
    )
    message("Example", (1, "features", F.TYPE_MESSAGE, opt, ".evenshard.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("evenshard.Example"))


def parse_features(data: bytes) -> dict[str, tuple[str, list]]:
    """``{name: (kind, values)}`` of a serialized tf.train.Example, kind ``bytes``,
    ``int64``, ``float`` or ``""`` (a feature without a list).

    Raises:
        ValueError: the data is not a tf.train.Example.
    """
    from google.protobuf.message import DecodeError

    try:
        example = _example_class().FromString(data)
    except DecodeError as e:
        raise InvalidValueError(f"not a tf.train.Example ({e})") from None
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = (
            (kind.removesuffix("_list"), list(getattr(feature, kind).value)) if kind else ("", [])
        )
    return out


def parse_example(data: bytes) -> dict[str, bytes | int]:
    """``{name: first value}`` of a serialized tf.train.Example (bytes or int features)."""
    example = _example_class().FromString(data)
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else ()
        out[name] = values[0] if len(values) else None
    return out
