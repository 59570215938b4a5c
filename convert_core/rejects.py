"""The rejects: every input that is not written, in one file, and whether there are few
enough of them for shards to be written (the gate)."""

from __future__ import annotations

import json

from convert_core.records import Reject


def rejects_text(rejects: list[Reject]) -> bytes:
    """The rejects file: a JSON line each, sorted. The whole reject sorts: one input can be
    rejected twice (a duplicate row of an empty file), and the runner decides which
    arrives first."""
    return "".join(r.to_json() + "\n" for r in sorted(rejects)).encode("utf-8")


def parse_rejects(data: bytes) -> list[Reject]:
    """The Rejects of a rejects file's bytes (``rejects_text``)."""
    return [Reject(**json.loads(line)) for line in data.decode("utf-8").splitlines()]


def summary(rejects: list[Reject]) -> dict[str, int]:
    """{reason: count}, by reason."""
    counts: dict[str, int] = {}
    for r in rejects:
        counts[r.reason] = counts.get(r.reason, 0) + 1
    return dict(sorted(counts.items()))


def gate(max_fraction: float, inputs: int, reject_summary: dict[str, int]) -> dict:
    """{"ok", "inputs", "rejects", "max_fraction"}: may shards be written? (rejects at
    most ``max_fraction`` of the inputs: ``--max_reject_fraction``)."""
    rejected = sum(reject_summary.values())
    ok = rejected <= max_fraction * inputs
    return {"ok": ok, "inputs": inputs, "rejects": rejected, "max_fraction": max_fraction}
