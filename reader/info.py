"""Loading and checking a converted dataset's ``dataset_info.json``."""

from __future__ import annotations

import json
import os

INFO_FILE = "dataset_info.json"
SUPPORTED_FORMAT_VERSIONS = (1,)


class DatasetError(ValueError):
    """A dataset that is missing, incomplete or damaged; the message names the file."""


def _join(data_dir: str, name: str) -> str:
    return f"{data_dir.rstrip('/')}/{name}"


def load_info(data_dir: str) -> dict:
    """Returns the parsed ``dataset_info.json`` of a dataset.

    Raises:
        DatasetError: the folder holds no finished dataset (a conversion that
            failed or is still running leaves no dataset_info.json).
    """
    import tensorflow as tf

    path = _join(data_dir, INFO_FILE)
    if not tf.io.gfile.exists(path):
        hint = ""
        if tf.io.gfile.isdir(data_dir) and any(
            ".tfrecord" in name for name in tf.io.gfile.listdir(data_dir)
        ):
            hint = " (shards are there: the conversion did not finish; run it again)"
        raise DatasetError(
            f"{path} not found: {data_dir} is not a finished evenshard dataset{hint}"
        )
    with tf.io.gfile.GFile(path, "r") as f:
        try:
            info = json.load(f)
        except ValueError as e:
            raise DatasetError(f"{path} is not valid JSON: {e}") from None
    if info.get("format_version") not in SUPPORTED_FORMAT_VERSIONS:
        raise DatasetError(
            f"{path}: format_version {info.get('format_version')!r} is not "
            f"one this reader knows ({SUPPORTED_FORMAT_VERSIONS})"
        )
    return info


def split_shards(info: dict, data_dir: str, split: str) -> list[dict]:
    """The shards of a split as [{path, num_examples, num_bytes}], each checked to exist
    with its recorded size (a missing or truncated shard is named here, before reading)."""
    import tensorflow as tf

    splits = info["splits"]
    if split not in splits:
        raise DatasetError(f"split {split!r} not in {data_dir}; it has {', '.join(splits)}")
    shards = []
    for shard in splits[split]["shards"]:
        path = _join(data_dir, shard["file"])
        if not tf.io.gfile.exists(path):
            raise DatasetError(f"shard {path} listed in {INFO_FILE} is missing")
        size = tf.io.gfile.stat(path).length
        if size != shard["num_bytes"]:
            raise DatasetError(
                f"shard {path} has {size} bytes, {INFO_FILE} records "
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
    return root if "://" in root else os.path.abspath(root)
