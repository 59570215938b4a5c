"""The shards of a split, checked before reading; where path records point."""

from __future__ import annotations

import os

from schemas import layout, storage
from schemas.info import DatasetError


def split_shards(info: dict, data_dir: str, split: str) -> list[dict]:
    """The shards of a split as [{path, num_examples, num_bytes}], each checked to exist
    with its recorded size (a missing or truncated shard is named here, before reading)."""
    splits = info["splits"]
    if split not in splits:
        raise DatasetError(f"split {split!r} not in {data_dir}; it has {', '.join(splits)}")
    shards = []
    for shard in splits[split]["shards"]:
        path = layout.join(data_dir, shard["file"])
        if not storage.exists(path):
            raise DatasetError(f"shard {path} listed in {layout.INFO_FILE} is missing")
        size = storage.size(path)
        if size != shard["num_bytes"]:
            raise DatasetError(
                f"shard {path} has {size} bytes, {layout.INFO_FILE} records "
                f"{shard['num_bytes']}: the file is truncated or was replaced"
            )
        shards.append({"path": path, "num_examples": shard["num_examples"], "num_bytes": size})
    return shards


def default_path_root(info: dict, path_root: str | None) -> str | None:
    if info["record_kind"] != "path":
        return None
    root = path_root or info.get("path_root")
    if not root:
        raise DatasetError("a path-kind dataset needs path_root (none recorded, none given)")
    return root if storage.is_url(root) else os.path.abspath(root)
