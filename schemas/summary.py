"""A human summary of a dataset (``evenshard inspect``), from dataset_info.json alone.

Splits, shards, examples, bytes, the spread of shard sizes, the label
distribution per split, rejects by reason, the seed and the options. Reads no
records (use ``evenshard validate`` to check them).
"""

from __future__ import annotations

import json

from schemas.info import written


def summarize(info: dict) -> dict:
    """The facts ``inspect`` prints, as a JSON-ready dict."""
    splits = {}
    for name, s in info["splits"].items():
        sizes = [sh["num_examples"] for sh in s["shards"]] or [0]
        nbytes = [sh["num_bytes"] for sh in s["shards"]] or [0]
        n = s["num_examples"]
        splits[name] = {
            "num_examples": n,
            "num_shards": len(s["shards"]),
            "num_bytes": s["num_bytes"],
            "shard_examples": {"min": min(sizes), "max": max(sizes)},
            "shard_bytes": {"min": min(nbytes), "max": max(nbytes)},
            "label_fractions": {
                k: round(v / n, 4) if n else 0.0 for k, v in s["label_counts"].items()
            },
            "label_counts": s["label_counts"],
        }
    return {
        "record_kind": info["record_kind"],
        "seed": info.get("seed"),
        "balance": info.get("balance"),
        "compression": info.get("compression"),
        "split_options": info.get("split_options"),
        "shard_options": info.get("shard_options"),
        "labels": info["labels"],
        "inputs": info["inputs"],
        "written": written(info),
        "rejects": info["rejects"],
        "splits": splits,
        **({"path_root": info["path_root"]} if "path_root" in info else {}),
    }


def render(summary: dict, data_dir: str) -> str:
    lines = [
        f"{data_dir}: {summary['record_kind']} records, {summary['written']:,} written of "
        f"{summary['inputs']:,} inputs, {len(summary['labels'])} labels",
        f"  seed {summary['seed']}, balance {summary['balance']}, compression "
        f"{summary['compression']}, splits {json.dumps(summary['split_options'])}",
        f"  {'split':<10}{'examples':>10}{'shards':>8}{'MB':>10}  per shard (examples, MB)",
    ]
    for name, s in summary["splits"].items():
        se, sb = s["shard_examples"], s["shard_bytes"]
        lines.append(
            f"  {name:<10}{s['num_examples']:>10,}{s['num_shards']:>8}"
            f"{s['num_bytes'] / 1e6:>10.1f}  {se['min']}-{se['max']}, "
            f"{sb['min'] / 1e6:.2f}-{sb['max'] / 1e6:.2f}"
        )
    lines.append("  labels per split (fraction):")
    for name, s in summary["splits"].items():
        mix = ", ".join(f"{k} {v:.3f}" for k, v in s["label_fractions"].items())
        lines.append(f"    {name}: {mix}")
    r = summary["rejects"]
    reasons = ", ".join(f"{k} {v}" for k, v in r["by_reason"].items()) or "none"
    lines.append(f"  rejects: {r['total']} ({reasons})")
    if "path_root" in summary:
        lines.append(f"  path_root: {summary['path_root']}")
    return "\n".join(lines)
