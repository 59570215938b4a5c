"""``dataset_info.json``: the one parser, and the checks every reader of it relies on."""

from __future__ import annotations

import json
import re

from schemas import layout, storage
from schemas.errors import Error

# What a conversion leaves before it finishes (besides shards).
_PARTIAL = (layout.INCOMPLETE_DIR, layout.REJECTS_FILE.split("/")[0], layout.SCHEMA_FILE)

REQUIRED_FIELDS = ("format_version", "record_kind", "labels", "splits", "inputs", "rejects")

SHA256 = re.compile(r"[0-9a-f]{64}")  # a shard's sha256: its hex digest, lowercase


class DatasetError(Error, ValueError):
    """A dataset that is missing, incomplete or damaged; the message names the file."""


def parse_info(data: bytes | str, where: str = layout.INFO_FILE) -> dict:
    """Parses and checks the text of a ``dataset_info.json``.

    Checks: valid JSON object; the required fields; a format version this
    code knows; every shard a plain file name by the shard-name rule (so a
    hand-edited file cannot send a reader outside the dataset folder),
    listed once, with the suffix of the compression; counts whole numbers,
    each split's the sum of its shards'; a listed sha256 64 lowercase hex
    digits (the cache names copies by it: nothing else may reach a path).

    Raises:
        DatasetError: naming ``where`` and what is wrong.
    """
    try:
        info = json.loads(data)
    except ValueError as e:
        raise DatasetError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(info, dict):
        raise DatasetError(f"{where} is not an evenshard dataset info (not a JSON object)")
    missing = [k for k in REQUIRED_FIELDS if k not in info]
    if missing:
        raise DatasetError(
            f"{where} is not an evenshard dataset info: missing field(s) {', '.join(missing)}"
        )
    if info["format_version"] not in layout.SUPPORTED_FORMAT_VERSIONS:
        raise DatasetError(
            f"{where}: format_version {info['format_version']!r} is not one this "
            f"version of evenshard knows ({layout.SUPPORTED_FORMAT_VERSIONS})"
        )
    if not isinstance(info["splits"], dict):
        raise DatasetError(f"{where}: splits is not an object")
    compression = info.get("compression", "none")
    if compression not in layout.COMPRESSIONS:
        raise DatasetError(
            f"{where}: compression {compression!r} is not one of {', '.join(layout.COMPRESSIONS)}"
        )
    seen: dict[str, str] = {}
    for split, s in info["splits"].items():
        if not isinstance(s, dict) or not isinstance(s.get("shards", []), list):
            raise DatasetError(f"{where}: split {split} is not an object with a shards list")
        total = 0
        for shard in s.get("shards", []):
            name = shard.get("file") if isinstance(shard, dict) else None
            if not isinstance(name, str) or not layout.is_shard_name(name):
                raise DatasetError(
                    f"{where}: split {split}: shard {name!r} is not a plain shard file name "
                    "inside the dataset folder"
                )
            if name in seen:
                raise DatasetError(
                    f"{where}: shard {name} is listed twice (splits {seen[name]} and {split}): "
                    "its records would be read twice"
                )
            seen[name] = split
            if not name.endswith(layout.shard_suffix(compression)):
                raise DatasetError(
                    f"{where}: shard {name} does not end in {layout.shard_suffix(compression)}, "
                    f"as compression {compression!r} says"
                )
            for field, expected in (
                ("dali_index", layout.index_name(name)),
                ("near", name + layout.NEAR_SUFFIX),
            ):
                if field in shard and shard[field] != expected:
                    raise DatasetError(
                        f"{where}: split {split}: shard {name}: {field} "
                        f"{shard[field]!r} is not {expected!r}"
                    )
            for field in ("num_examples", "num_bytes"):
                _whole(shard.get(field), f"{where}: shard {name}: {field}")
            digest = shard.get("sha256", "0" * 64)
            if not isinstance(digest, str) or not SHA256.fullmatch(digest):
                raise DatasetError(
                    f"{where}: split {split}: shard {name}: sha256 {_short(digest)} is not "
                    "64 lowercase hex digits (convert again, or restore the file)"
                )
            total += shard["num_examples"]
        _whole(s.get("num_examples"), f"{where}: split {split}: num_examples")
        if total != s["num_examples"]:
            raise DatasetError(
                f"{where}: split {split}: num_examples {s['num_examples']} is not the sum of "
                f"its shards' ({total})"
            )
    return info


def _whole(value, what: str) -> None:
    """A count: a JSON whole number >= 0 (not 25.0, "25" or true)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DatasetError(f"{what} is {value!r}, not a whole number >= 0")


def _short(value) -> str:
    """A value for a one-line message: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_info(data_dir: str) -> dict:
    """Reads and checks ``data_dir/dataset_info.json`` (local or a URL).

    Raises:
        DatasetError: the folder holds no finished dataset (a conversion that
            failed or is still running leaves no dataset_info.json), or the
            file is damaged.
    """
    path = layout.join(data_dir, layout.INFO_FILE)
    if not storage.exists(path):
        hint = ""
        if storage.isdir(data_dir) and any(
            layout.is_shard_name(name) or name in _PARTIAL for name in storage.listdir(data_dir)
        ):
            hint = " (a conversion left files here but did not finish: run it again)"
        raise DatasetError(
            f"{path} not found: {data_dir} is not a finished evenshard dataset{hint}"
        )
    return parse_info(storage.read_bytes(path), path)


def written(info: dict) -> int:
    """Examples written, over all splits."""
    return sum(s["num_examples"] for s in info["splits"].values())
