"""Checks serialized tf.train.Examples against a TFMD schema with tfx-bsl.

``ExamplesToRecordBatchDecoder`` turns a batch into Arrow columns; a batch
that fails to decode (a feature of the wrong type) is decoded again record by
record, each with a fresh decoder (one that raised once is unusable), so every
bad record is named by its index.
"""

from __future__ import annotations

from collections.abc import Iterator


def _decoder(schema=None):
    from tfx_bsl.coders import example_coder

    if schema is None:
        return example_coder.ExamplesToRecordBatchDecoder()
    return example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString())


def check_examples(records: list[bytes], schema, first_index: int = 0) -> Iterator[tuple[int, str]]:
    """Yields (record index, problem) for each record that breaks the schema.

    Checks: parses with the schema's types; no missing and no extra features;
    exactly one value per feature (shape [1]); int and string domains.
    """
    indices = list(range(len(records)))
    try:
        batch = _decoder(schema).DecodeBatch(records)
    except Exception:  # noqa: BLE001 - tfx-bsl raises a bare RuntimeError-like error
        indices = []
        for i, record in enumerate(records):
            try:
                _decoder(schema).DecodeBatch([record])
                indices.append(i)
            except Exception as e:  # noqa: BLE001 - the message names the feature
                yield first_index + i, f"does not parse against the schema: {e}"
        if not indices:
            return
        batch = _decoder(schema).DecodeBatch([records[i] for i in indices])

    known = {f.name for f in schema.feature}
    for feature in schema.feature:
        values = batch.column(batch.schema.get_field_index(feature.name)).to_pylist()
        for i, value in zip(indices, values):
            problem = _check_value(feature, value)
            if problem:
                yield first_index + i, f"feature {feature.name}: {problem}"
    loose = _decoder().DecodeBatch([records[i] for i in indices])
    for name in loose.schema.names:
        if name in known:
            continue
        for i, value in zip(indices, loose.column(loose.schema.get_field_index(name)).to_pylist()):
            if value is not None:
                yield first_index + i, f"extra feature {name} is not in the schema"


def _check_value(feature, value) -> str | None:
    if value is None:
        return "missing"
    expected = 1
    if feature.HasField("shape"):
        expected = 1
        for dim in feature.shape.dim:
            expected *= dim.size
    if len(value) != expected:
        return f"has {len(value)} values, the schema says {expected}"
    for v in value:
        if feature.HasField("int_domain"):
            d = feature.int_domain
            if (d.HasField("min") and v < d.min) or (d.HasField("max") and v > d.max):
                lo = d.min if d.HasField("min") else "-inf"
                hi = d.max if d.HasField("max") else "inf"
                return f"value {v} outside the domain [{lo}, {hi}]"
        if feature.HasField("string_domain") and feature.string_domain.value:
            text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            if text not in feature.string_domain.value:
                return f"value {text!r} not in the domain"
    return None
