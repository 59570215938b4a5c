"""The dataset's description, once every shard and the rejects are written: what
``dataset_info.json`` holds, the schema and the labels, the checks that the counts
reconcile, and the one line a run refused for its inputs writes instead.

Order of appearance in the output folder (``dataset_files``): shards and
``rejects/`` first, then ``schema.pbtxt`` and ``labels.txt``, and
``dataset_info.json`` last. Its presence means the dataset is complete.
"""

from __future__ import annotations

import json

import schemas
from convert_core.records import Reject
from convert_core.write import FEATURE_STATS
from schemas import inferred
from schemas.dataset_info import parse_dataset_info
from schemas.errors import OperationError
from schemas.layout import INFO_FILE, LABELS_FILE, REJECTS_FILE, SCHEMA_FILE


def dataset_info(
    settings: dict,
    shards: list[dict],
    plan: dict,
    vocab: dict,
    gate: dict,
    reject_summary: dict,
    near: dict | None = None,
) -> dict:
    """The content of dataset_info.json. Deterministic: no timestamps, sorted keys."""
    splits = {}
    for split, p in plan.items():
        listed = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
        splits[split] = {
            "num_examples": sum(s["num_examples"] for s in listed),
            "num_bytes": sum(s["num_bytes"] for s in listed),
            "num_shards": len(listed),
            # "": an example without --label_feature (no label)
            "label_counts": {k: n for k, n in p["label_counts"].items() if k},
            "shards": [{k: v for k, v in s.items() if k not in _NOT_LISTED} for s in listed],
        }
    found = {"near_duplicates": near} if near else {}
    return {
        **settings,
        **found,
        "labels": vocab["labels"],
        "formats": vocab["formats"],
        "splits": splits,
        "inputs": gate["inputs"],
        "rejects": {"total": gate["rejects"], "by_reason": reject_summary, "file": REJECTS_FILE},
    }


# what a shard's info holds for finalize only (FEATURE_STATS: the example kind's counts)
_NOT_LISTED = ("split", "index", FEATURE_STATS)


def too_many_rejects(gate: dict, rejects_file: str) -> str:
    """The refusal of a run whose rejects are above ``--max_reject_fraction`` (the gate's)."""
    return (
        f"{gate['rejects']} of {gate['inputs']} inputs were rejected, above "
        f"--max_reject_fraction={gate['max_fraction']}; no dataset was written. "
        f"See {rejects_file} for each input and its reason, then fix the "
        "inputs or raise the limit"
    )


def inputs_changed(changed: list[Reject], rejects_file: str) -> str:
    """The refusal of a run whose inputs changed while the shards were written."""
    sources = ", ".join(sorted(r.source for r in changed)[:3])
    return (
        f"{len(changed)} input(s) changed while convert ran ({sources}"
        f"{', ...' if len(changed) > 3 else ''}); no dataset was written. They are "
        f"`changed` rejects in {rejects_file}; run again once the inputs "
        "stay as they are"
    )


def check_counts(info: dict, gate: dict, changed: list[Reject]) -> int:
    """The examples written; they, the rejects and the changed inputs reconcile with the
    inputs.

    Raises:
        OperationError: they do not (a bug, never a user error: said loudly).
    """
    written = sum(s["num_examples"] for s in info["splits"].values())
    if written + gate["rejects"] + len(changed) != gate["inputs"]:
        raise OperationError(
            f"counts do not reconcile: {gate['inputs']} inputs, {written} written, "
            f"{gate['rejects']} rejected, {len(changed)} changed"
        )
    return written


def check_planned(info: dict, plan: dict) -> None:
    """Every split holds the examples its plan gave it.

    Raises:
        OperationError: a split that does not.
    """
    for split, s in info["splits"].items():
        if s["num_examples"] != plan[split]["num_examples"]:
            raise OperationError(
                f"split {split}: planned {plan[split]['num_examples']} "
                f"examples, wrote {s['num_examples']}"
            )


def schema_of(info: dict, shards: list[dict], vocab: dict):
    """The dataset's schema: the record kind's, or for the example kind the one inferred
    from the records written (``schemas.inferred``)."""
    if info["record_kind"] != "example":
        return schemas.dataset_schema(info["record_kind"], vocab["labels"], vocab["formats"])
    stats = inferred.merge(s[FEATURE_STATS] for s in shards)
    return inferred.infer_schema(stats, sum(s["num_examples"] for s in shards))


def dataset_files(info: dict, shards: list[dict], vocab: dict) -> list[tuple[str, bytes]]:
    """(name in the output folder, bytes) of the files that describe the dataset, in the
    order they are written: ``dataset_info.json`` last."""
    schema = schemas.to_text(schema_of(info, shards, vocab)).encode("utf-8")
    labels = "".join(label + "\n" for label in vocab["labels"]).encode("utf-8")
    # parsed as the readers parse it (a document they would refuse stops convert here),
    # written in the one form DatasetInfo.to_json gives
    described = parse_dataset_info(json.dumps(info), f"the {INFO_FILE} convert made")
    return [(SCHEMA_FILE, schema), (LABELS_FILE, labels), (INFO_FILE, described.to_json().encode())]
