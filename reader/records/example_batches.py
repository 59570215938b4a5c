"""Pass-through records (``record_kind: "example"``) in the reader's spine: what a read of
them may ask, the spec its records are parsed by, and their batches on both routes.

The decode stage of such a read parses, and decodes nothing: a batch is the spec's
features by name (``reader.examples``: arrays, variable-length ones ``Padded``), plus
``label`` (the label feature's id in ``labels.txt``: an int label is its own id; only
when the dataset names a label feature), ``key`` (the key feature's text; only when it
names one) and ``mask`` (False on padding rows, every value zero there). The tf graph
parses with ``tf.io.parse_example`` (``reader.decode.tf_decode.ExampleDecoder``), the
Python route with the protobuf codec (``python_batch``): the same arrays.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from reader.examples import Feature, Padded, load_spec, parse_batch
from schemas.errors import InvalidValueError
from schemas.info import DatasetError

KIND = "example"
RESERVED = ("label", "key", "mask")  # the names a batch gives besides the features


@dataclasses.dataclass(frozen=True)
class RecordFields:
    """Which features give a record's label and key (dataset_info.json's
    ``label_feature``, ``key_feature``; None: the dataset has none), the label's kind
    (``int64`` or ``bytes``) and the labels (an id is a position)."""

    label: str | None
    label_kind: str
    key: str | None
    labels: tuple[str, ...]

    @classmethod
    def of(cls, info, schema_spec: dict[str, Feature]) -> RecordFields:
        kind = schema_spec[info.label_feature].kind if info.label_feature else ""
        return cls(info.label_feature, kind, info.key_feature, info.labels)

    def wanted(self) -> dict[str, Feature]:
        """The label and key features as a spec (one value each: convert checked it)."""
        out = {}
        if self.label:
            out[self.label] = Feature(self.label_kind, (1,))
        if self.key:
            out[self.key] = Feature("bytes", (1,))
        return out

    def label_and_key(self, found: dict) -> tuple[int, str]:
        """(label id, key) of a record's ``schemas.example.parse_features``: 0 and ""
        for what the dataset does not name."""
        label = key = None
        if self.label:
            value = found[self.label][1][0]
            label = value if self.label_kind == "int64" else self.labels.index(value.decode())
        if self.key:
            key = found[self.key][1][0].decode()
        return label or 0, key or ""


def is_examples(info) -> bool:
    return info.record_kind == KIND


def read_spec(sources, features) -> tuple[dict[str, Feature], RecordFields]:
    """The spec a read's records are parsed by (``features``, the user's, else the
    first source's ``schema.pbtxt``) and their ``RecordFields``; the sources of a mix
    must agree on both.

    Raises:
        ValueError: mixed sources of other schemas (with no ``features=``) or label and
            key features; a spec feature named ``label``, ``key`` or ``mask`` that is not
            the feature those names give.
    """
    from reader.examples import as_spec

    first = sources[0]
    schema_spec = load_spec(first.data_dir)
    fields = RecordFields.of(first.info, schema_spec)
    for source in sources[1:]:
        other = load_spec(source.data_dir)
        if RecordFields.of(source.info, other) != fields or (
            features is None and other != schema_spec
        ):
            raise InvalidValueError(
                f"reader.mix: {source.data_dir} has another schema.pbtxt or other label and "
                f"key features than {first.data_dir}: give features= (a spec every source "
                "holds), and mix sources of the same label_feature and key_feature"
            )
    spec = schema_spec if features is None else as_spec(features)
    # a batch's label and key are the features named at conversion (none named: a
    # feature of that name is read as it is); its mask is always its own
    given = {"label": fields.label, "key": fields.key, "mask": "a batch's own"}
    for name in RESERVED:
        if name in spec and given[name] not in (None, name):
            raise InvalidValueError(
                f"feature {name!r}: a batch's {name!r} is the "
                f"{'mask' if name == 'mask' else name + ' feature named at conversion'}, "
                f"and {name!r} is not it: leave it out of features= (give the others)"
            )
    return spec, fields


def python_batch(batch, spec: dict[str, Feature], fields: RecordFields) -> dict:
    """The Python route's batch of a ``reader.records.source.Batch`` whose ``encoded`` rows are
    serialized records: the real rows parsed (``parse_batch``), the masked rows zeros
    (0 values of a variable-length feature), as the tf graph pads them."""
    mask = np.asarray(batch.mask, bool)
    rows = np.flatnonzero(mask)
    parsed = parse_batch([bytes(batch.encoded[i]) for i in rows], spec)
    out = {name: _scattered(value, rows, len(mask)) for name, value in parsed.items()}
    if fields.label:
        out["label"] = np.where(mask, batch.label, 0).astype(np.int64)
    if fields.key:
        out["key"] = [k if m else "" for k, m in zip(batch.key, mask)]
    out["mask"] = mask
    return out


def _scattered(value, rows: np.ndarray, size: int):
    """``value`` (of the real rows) as ``size`` rows, the others zeros."""
    if isinstance(value, Padded):
        lengths = np.zeros(size, np.int64)
        lengths[rows] = value.lengths
        return Padded(_scattered(value.values, rows, size), lengths)
    if len(rows) == size:
        return value
    out = np.zeros((size, *value.shape[1:]), value.dtype)
    if value.dtype == object:
        out[...] = b""
    out[rows] = value
    return out


def refuse(data_dir: str, info, face: str) -> None:
    """A face that decodes images only (DALI) refuses pass-through records in one line."""
    if is_examples(info):
        raise DatasetError(
            f"{face} decodes images, and {data_dir} holds records that are not images "
            "(record_kind example): read it with reader.make_dataset, NumpyReader or "
            'TorchReader(backend="tf" or "python")'
        )


def python_parser(read, transform, views: int):
    """The Python route's decode stage for a read of pass-through records: a function of
    a ``reader.records.source.Batch`` (``python_batch`` with the read's spec); None for images.

    Raises:
        ValueError: a ``transform`` or ``views``, which run on decoded images.
    """
    if not is_examples(read.sources[0].info):
        return None
    if transform is not None or views != 1:
        raise InvalidValueError(
            f"transform= and views= run on decoded images, and {read.sources[0].data_dir} "
            "holds records that are not images (record_kind example): read its batches of "
            "features and map them yourself"
        )
    spec, fields = read_spec(read.sources, read.options.features)
    return functools.partial(python_batch, spec=spec, fields=fields)


def _first_info(data):
    """The dataset_info of ``data`` (a folder, or a ``reader.mix``'s first source)."""
    from reader.values.mixture import Mixture
    from schemas.dataset_info import load_dataset_info

    return load_dataset_info(data.sources[0][0] if isinstance(data, Mixture) else data)


def holds_examples(data) -> bool:
    """Whether ``data`` (a folder or a mix) holds records that are not images."""
    return is_examples(_first_info(data))


def refuse_examples(data, face: str) -> None:
    """``refuse`` for ``data`` (a folder or a mix), before its options are checked."""
    refuse(data.sources[0][0] if hasattr(data, "sources") else data, _first_info(data), face)
