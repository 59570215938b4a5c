"""The evenshard format: the ground floor that ``beam_jobs`` writes and ``reader`` reads.

- ``features``: feature keys and record kinds; ``layout``: file names, the
  shard-name rule, the format version; ``info``: the ``dataset_info.json``
  parser; ``tfrecord``: framing; ``example``: the Example codec;
  ``storage``: file access for readers.
- Here: the records as TFMD schemas. ``base_schema(kind)`` is the schema of
  a record kind (``image`` or ``path``); ``dataset_schema`` specialises it to
  one dataset (label domain, formats seen, label texts), which
  ``evenshard convert`` writes as ``schema.pbtxt``.
- ``validate`` and ``summary``: checking and summarizing a dataset.

Nothing here imports Beam or TensorFlow at import time.
"""

from __future__ import annotations

import importlib.resources

from schemas import features, layout, storage
from schemas.errors import Error, InvalidValueError
from schemas.features import RECORD_KINDS
from schemas.info import DatasetError, load_info

__all__ = [
    "RECORD_KINDS",
    "DatasetError",
    "Error",
    "base_schema",
    "dataset_schema",
    "feature_spec",
    "load",
    "load_info",
    "to_text",
]


def base_schema(kind: str):
    """The TFMD ``Schema`` proto of a record kind."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    if kind not in RECORD_KINDS:
        raise InvalidValueError(f"record kind must be one of {RECORD_KINDS}, got {kind!r}")
    text = importlib.resources.files(__name__).joinpath(f"{kind}.pbtxt").read_text("utf-8")
    return text_format.Parse(text, schema_pb2.Schema())


def dataset_schema(kind: str, labels: list[str], formats: list[str]):
    """The schema of one dataset: label ids in [0, len(labels)), the formats it holds."""
    schema = base_schema(kind)
    for feature in schema.feature:
        if feature.name == features.LABEL:
            feature.int_domain.min = 0
            feature.int_domain.max = max(len(labels) - 1, 0)
        elif feature.name == features.FORMAT and formats:
            del feature.string_domain.value[:]
            feature.string_domain.value.extend(sorted(formats))
        elif feature.name == features.TEXT:
            feature.string_domain.value.extend(labels)
    return schema


def to_text(schema) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(schema)


def load(data_dir: str):
    """Reads the ``schema.pbtxt`` of a dataset folder (local or a URL)."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    text = storage.read_bytes(layout.join(data_dir, layout.SCHEMA_FILE)).decode("utf-8")
    return text_format.Parse(text, schema_pb2.Schema())


def feature_spec(schema) -> dict:
    """``tf.io.parse_example`` spec of a schema, derived by tfx-bsl (never by hand).

    Every evenshard feature has shape [1]; parsers squeeze it.
    """
    from tfx_bsl.tfxio import tensor_representation_util as tru

    types = {f.name: f.type for f in schema.feature}
    representations = tru.InferTensorRepresentationsFromSchema(schema)
    return {
        name: tru.CreateTfExampleParserConfig(rep, types[name])
        for name, rep in representations.items()
    }
