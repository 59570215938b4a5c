"""The shards of a split, checked before reading; where path records point; what a read
of the dataset's record kind may ask."""

from __future__ import annotations

import hashlib
import json
import os

from reader.values.option_groups import GROUPS, refuse_untaken
from schemas import layout, storage, tfrecord
from schemas.dataset_info import DatasetInfo, SplitInfo
from schemas.errors import InvalidValueError
from schemas.info import DatasetError


def split_shards(info: DatasetInfo | dict, data_dir: str, split: str) -> list[dict]:
    """The shards of a split as [{path, num_examples, num_bytes}], each checked to exist
    with its recorded size (a missing or truncated shard is named here, before reading).
    ``info`` may be the dict ``schemas.info.load_info`` gives (callers that keep it)."""
    if isinstance(info, dict):
        info = DatasetInfo.of(info)
    shards = []
    for shard in named_split(info, data_dir, split).shards:
        path = layout.join(data_dir, shard.file)
        check_shard(path, shard.num_bytes)
        index = layout.join(data_dir, shard.dali_index) if shard.dali_index else None
        shards.append(
            {
                "path": path,
                "num_examples": shard.num_examples,
                "num_bytes": shard.num_bytes,
                "index": index,
                **({"sha256": shard.sha256} if shard.sha256 is not None else {}),
            }
        )
    return shards


def named_split(info: DatasetInfo, data_dir: str, split: str) -> SplitInfo:
    """The split ``split`` of the dataset in ``data_dir``; a DatasetError naming the
    folder and its splits when it has none of that name."""
    if split not in info.split_names:
        names = ", ".join(info.split_names)
        raise DatasetError(f"split {split!r} not in {data_dir}; it has {names}")
    return info.split(split)


def check_shard(path: str, listed: int) -> None:
    """Raises DatasetError unless the shard is there with its listed size: checked when a
    read is built, and again as each run of records starts (a shard removed or replaced
    under a running read, by ``convert --overwrite`` say, stops it naming the shard;
    tf.data's reader retried a file it could not open forever)."""
    if not storage.exists(path):
        raise shard_error(path, listed)
    size = storage.size(path)
    if size != listed:
        raise shard_error(path, listed, size)


def open_shard(path: str, listed: int) -> int:
    """A read-only descriptor of a local shard, checked to have its listed size: the
    file read is then the file checked, whatever happens to the path after."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise shard_error(path, listed) from None
    size = os.fstat(fd).st_size
    if size != listed:
        os.close(fd)
        raise shard_error(path, listed, size)
    return fd


def shard_error(path: str, listed: int, size: int | None = None) -> DatasetError:
    """The error for a shard that is gone (``size`` None) or has another size than listed."""
    if size is None:
        return DatasetError(
            f"shard {path} listed in {layout.INFO_FILE} is missing (removed while it was "
            "read? a dataset replaced under a read must be read again)"
        )
    return DatasetError(
        f"shard {path} has {size} bytes, {layout.INFO_FILE} records "
        f"{listed}: the file is truncated or was replaced"
    )


def split_fingerprint(info: DatasetInfo, split: str) -> str:
    """16 hex digits that change when any shard of ``split`` changes: a digest of its
    shards' names, counts and sha256 as dataset_info.json lists them."""
    shards = [
        [s.file, s.num_examples, s.num_bytes if s.sha256 is None else s.sha256]
        for s in info.split(split).shards
    ]
    return hashlib.sha256(json.dumps([split, shards]).encode()).hexdigest()[:16]


def load_index(shard: dict):
    """A shard's DALI index as an int64 array [[offset, size]], checked to describe the
    shard exactly (``tfrecord.parse_index``): the records a reader fetches by it
    are the ones dataset_info.json counts, each once. None without an index (gzip)."""
    if shard["index"] is None:
        return None
    try:
        text = storage.read_bytes(shard["index"])
    except OSError:
        raise DatasetError(
            f"{shard['index']} is missing: readers check each shard's record count by the "
            "DALI index convert writes beside it (convert again to get it)"
        ) from None
    try:
        return tfrecord.parse_index(text, shard["num_examples"], shard["num_bytes"], shard["index"])
    except ValueError as e:
        raise DatasetError(f"{e} (shard {shard['path']})") from None


def default_path_root(info: DatasetInfo, path_root: str | None) -> str | None:
    """Where path records' files are: ``path_root`` given, else the one recorded (None
    for image records)."""
    if info.record_kind != "path":
        return None
    root = path_root or info.path_root
    if not root:
        raise DatasetError("a path-kind dataset needs path_root (none recorded, none given)")
    return root if storage.is_url(root) else os.path.abspath(root)


def check_path_root(root: str, first_path: str, given: bool) -> None:
    """Path records: the first record's image must be where ``root`` says.

    Catches images that moved after the conversion when the dataset is
    built, naming the file and the fix, instead of a raw NotFoundError from
    inside tf.data on the first batch.
    """
    target = layout.join(root, first_path)
    if storage.exists(target):
        return
    where = "the path_root you gave" if given else "the path_root recorded at conversion"
    raise DatasetError(
        f"path records point to images that are not there: {target} does not exist "
        f"({where} is {root}). If the images moved, pass path_root=THEIR_NEW_FOLDER "
        "(evenshard validate --path_root too)"
    )


def check_record_options(info: DatasetInfo, options, state, data_dir: str) -> None:
    """What a read of ``data_dir`` may ask of its record kind, refused in one line: an
    image option (the images group) or ``as_supervised`` for records that are not images
    (``record_kind: "example"``: parsed, nothing decoded), ``features=`` for images,
    excluding keys of records converted without a key feature."""
    if info.record_kind != "example":
        if options.features is not None:
            raise InvalidValueError(
                f"features= parses records that are not images: {data_dir} holds "
                f"{info.record_kind} records; leave features out"
            )
        return
    face = f"a read of {data_dir} (records that are not images, record_kind example)"
    instead = {
        "images": "its records are parsed as features= (or schema.pbtxt) says, "
        "nothing decoded; leave the image options out",
        "form": "its batches are dicts of features: take batch[name] and batch['label']",
    }
    refuse_untaken(options, frozenset(GROUPS) - set(instead), face, instead)
    if state is not None and state.excluded and not info.key_feature:
        raise InvalidValueError(
            f"the state excludes keys, and {data_dir} was converted without --key_feature: "
            "its records have no key to exclude by; convert with --key_feature"
        )
