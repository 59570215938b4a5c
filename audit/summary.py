"""A human summary of a dataset (``evenshard inspect``), from dataset_info.json alone.

Splits, shards, examples, bytes, the spread of shard sizes, the label
distribution per split, rejects by reason, the seed and the options. Reads no
records (use ``evenshard validate`` to check them).
"""

from __future__ import annotations

from schemas.dataset_info import DatasetInfo
from schemas.near import describe


def summarize(info: DatasetInfo) -> dict:
    """The facts ``inspect`` prints, as a JSON-ready dict."""
    splits = {}
    for s in info.splits:
        sizes = [sh.num_examples for sh in s.shards] or [0]
        nbytes = [sh.num_bytes for sh in s.shards] or [0]
        n = s.num_examples
        splits[s.name] = {
            "num_examples": n,
            "num_shards": len(s.shards),
            "num_bytes": s.num_bytes,
            "shard_examples": {"min": min(sizes), "max": max(sizes)},
            "shard_bytes": {"min": min(nbytes), "max": max(nbytes)},
            "label_fractions": {
                k: round(v / n, 4) if n else 0.0 for k, v in s.label_counts.items()
            },
            "label_counts": dict(s.label_counts),
        }
    missing = {
        s.name: [label for label in info.labels if not s.label_counts.get(label)]
        for s in info.splits
    }
    document = info.to_dict()  # the objects convert wrote, as JSON holds them
    return {
        "record_kind": info.record_kind,
        "seed": info.seed,
        "balance": info.balance,
        "compression": info.compression,
        "dedupe": info.dedupe or "none",
        **({"near_duplicates": document["near_duplicates"]} if info.near_duplicates else {}),
        "split_options": document.get("split_options"),
        "shard_options": document.get("shard_options"),
        "labels": list(info.labels),
        "inputs": info.inputs,
        "written": info.num_examples,
        "rejects": document["rejects"],
        "splits": splits,
        "missing_labels": {name: m for name, m in missing.items() if m},
        **({"path_root": info.path_root} if info.path_root is not None else {}),
    }


def _split_options(o: dict | None) -> str:
    if not o:
        return "splits as given"
    fractions = ", ".join(f"{k} {v:g}" for k, v in o["splits"].items())
    group = f", grouped by {o['group_by']}" if o.get("group_by") else ""
    return f"splits {fractions} ({o['split_mode']}, split_seed {o['split_seed']}{group})"


MAX_LABEL_ROWS = 30


def render(summary: dict, data_dir: str) -> str:
    """The text ``evenshard inspect`` prints: tables, not dicts."""
    splits = summary["splits"]
    lines = [
        f"{data_dir}: {summary['record_kind']} records, {summary['written']:,} written of "
        f"{summary['inputs']:,} inputs, {len(summary['labels'])} labels",
        f"  seed {summary['seed']}, balance {summary['balance']}, compression "
        f"{summary['compression']}, dedupe {summary['dedupe']}, "
        f"{_split_options(summary['split_options'])}",
        "",
        f"  {'split':<12}{'examples':>10}{'shards':>8}{'MB':>10}   per shard: examples, MB",
    ]
    for name, s in splits.items():
        se, sb = s["shard_examples"], s["shard_bytes"]
        lines.append(
            f"  {name:<12}{s['num_examples']:>10,}{s['num_shards']:>8}"
            f"{s['num_bytes'] / 1e6:>10.1f}   {se['min']}-{se['max']}, "
            f"{sb['min'] / 1e6:.2f}-{sb['max'] / 1e6:.2f}"
        )
    width = max([12, *(len(label) + 2 for label in summary["labels"][:MAX_LABEL_ROWS])])
    lines += ["", "  " + "label".ljust(width) + "".join(f"{n:>16}" for n in splits)]
    missing = summary.get("missing_labels", {})
    shown = summary["labels"][:MAX_LABEL_ROWS]
    shown += [x for m in missing.values() for x in m if x not in shown]  # always shown
    for label in shown:
        cells = []
        for s in splits.values():
            n = s["label_counts"].get(label, 0)
            cells.append(
                f"{n:>8,} {n / s['num_examples']:>6.1%}" if n else "MISSING"  # not rounded twice
            )
        lines.append("  " + label.ljust(width) + "".join(f"{c:>16}" for c in cells))
    if len(summary["labels"]) > len(shown):
        lines.append(f"  ... and {len(summary['labels']) - len(shown)} more labels (--json)")
    for name, labels in missing.items():
        lines.append(f"  ! split {name} has no examples of: {', '.join(labels)}")
    r = summary["rejects"]
    reasons = ", ".join(f"{k} {v}" for k, v in r["by_reason"].items()) or "none"
    lines += ["", f"  rejects: {r['total']} ({reasons})"]
    if "near_duplicates" in summary:
        lines.append("  " + describe(summary["near_duplicates"]))
    if "path_root" in summary:
        lines.append(f"  path_root: {summary['path_root']}")
    return "\n".join(lines)
