"""The schema of pass-through records (``--record_kind example``), inferred from them as
TFDV infers one, and the check of a record against such a schema.

Statistics are counted a record at a time (``add``) and merged (``merge``): for each
feature, for each kind of list it holds (``int64``, ``float``, ``bytes``), the records
holding it and the fewest and most values. A feature without a list (a ``Feature``
with no kind set) is missing, as tfx-bsl's decoder reads it; an empty list is present
with no values. ``infer_schema`` then writes a TFMD ``Schema``:

- ``type``: the kind most records hold (a tie: int64, then float, then bytes);
- ``presence``: ``min_fraction: 1.0 min_count: 1`` when every record holds the
  feature, else ``min_count: 1`` (TFDV's rule);
- ``shape { dim { size: N } }`` when every record holds exactly N >= 1 values
  (TFDV's ``infer_feature_shape``: tfx-bsl then gives a fixed-length spec), else
  ``value_count { min max }``, the fewest and most values seen (TFDV leaves ``max``
  open for lists; here it is this dataset's, so ``validate`` holds every record to it).

No domains are inferred (TFDV's string domains need the values' statistics, which are
not kept). Plain Python and protobuf: no Beam, no TensorFlow.
"""

from __future__ import annotations

KINDS = ("int64", "float", "bytes")  # the tie order of ``infer_schema``
_TYPES = {"int64": "INT", "float": "FLOAT", "bytes": "BYTES"}


def add(stats: dict, found: dict[str, tuple[str, list]]) -> dict:
    """Counts one record's features (``schemas.example.parse_features``) into ``stats``:
    {feature: {kind: [records, fewest values, most values]}}; returns ``stats``."""
    for name, (kind, values) in found.items():
        if not kind:  # no list: missing, as tfx-bsl reads it
            continue
        n = len(values)
        seen = stats.setdefault(name, {}).get(kind)
        if seen is None:
            stats[name][kind] = [1, n, n]
        else:
            seen[0] += 1
            seen[1] = min(seen[1], n)
            seen[2] = max(seen[2], n)
    return stats


def merge(parts) -> dict:
    """The statistics of several parts (``add``'s), as if counted at once."""
    out: dict = {}
    for part in parts:
        for name, kinds in part.items():
            into = out.setdefault(name, {})
            for kind, (count, lo, hi) in kinds.items():
                seen = into.get(kind)
                into[kind] = (
                    [count, lo, hi]
                    if seen is None
                    else [
                        seen[0] + count,
                        min(seen[1], lo),
                        max(seen[2], hi),
                    ]
                )
    return out


def infer_schema(stats: dict, num_records: int):
    """The TFMD ``Schema`` of ``num_records`` records counted in ``stats`` (module doc)."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    for name in sorted(stats):
        kinds = stats[name]
        kind = max(KINDS, key=lambda k: (kinds.get(k, [0])[0], -KINDS.index(k)))
        count, lo, hi = kinds[kind]
        feature = schema.feature.add(name=name, type=getattr(schema_pb2, _TYPES[kind]))
        every = sum(c for c, _, _ in kinds.values()) == num_records and count == num_records
        if every:
            feature.presence.min_fraction = 1.0
        feature.presence.min_count = 1
        if every and lo == hi and lo >= 1:
            feature.shape.dim.add(size=lo)
        else:
            feature.value_count.min = lo
            feature.value_count.max = hi
    return schema


def check_record(found: dict[str, tuple[str, list]], schema) -> list[str]:
    """What is wrong with one record (``parse_features``) against ``schema``: a feature
    every record must hold missing, a list of another kind, a number of values the
    schema does not allow, a value outside a domain, a feature the schema lacks."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    names = {schema_pb2.INT: "int64", schema_pb2.FLOAT: "float", schema_pb2.BYTES: "bytes"}
    problems = []
    known = set()
    for feature in schema.feature:
        known.add(feature.name)
        kind, values = found.get(feature.name, ("", []))
        if not kind:
            if feature.presence.min_fraction >= 1.0:
                problems.append(f"feature {feature.name}: missing (the schema says every record)")
            continue
        want = names.get(feature.type)
        if kind != want:
            problems.append(f"feature {feature.name}: {kind} values, the schema says {want}")
            continue
        problem = _count_problem(feature, len(values)) or _domain_problem(feature, values)
        if problem:
            problems.append(f"feature {feature.name}: {problem}")
    for name, (kind, _) in sorted(found.items()):
        if kind and name not in known:
            problems.append(f"extra feature {name} is not in the schema")
    return problems


def _count_problem(feature, n: int) -> str | None:
    if feature.HasField("shape"):
        size = 1
        for dim in feature.shape.dim:
            size *= dim.size
        return None if n == size else f"{n} values, the schema's shape holds {size}"
    if feature.HasField("value_count"):
        vc = feature.value_count
        if n < vc.min or (vc.HasField("max") and n > vc.max):
            hi = vc.max if vc.HasField("max") else "any"
            return f"{n} values, the schema allows {vc.min} to {hi}"
    return None


def _domain_problem(feature, values: list) -> str | None:
    if feature.HasField("int_domain"):
        d = feature.int_domain
        for v in values:
            if (d.HasField("min") and v < d.min) or (d.HasField("max") and v > d.max):
                return f"value {v} outside the schema's int domain"
    if feature.HasField("string_domain") and feature.string_domain.value:
        allowed = set(feature.string_domain.value)
        for v in values:
            text = v.decode("utf-8", "replace")
            if text not in allowed:
                return f"value {text!r} not in the schema's string domain"
    return None
