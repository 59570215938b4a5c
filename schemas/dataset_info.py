"""``DatasetInfo``: ``dataset_info.json`` as typed, frozen values, parsed once.

    info = load_dataset_info(data_dir)       # checked by schemas.info.parse_info
    info.record_kind, info.compression, info.labels
    info.split("train").shards[0].num_bytes

``schemas.info.load_info`` still gives the checked dict, for callers that keep it.
"""

from __future__ import annotations

import dataclasses

from schemas import layout
from schemas.info import DatasetError, load_info, parse_info


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard as dataset_info.json lists it (``file`` a name inside the dataset)."""

    file: str
    num_examples: int
    num_bytes: int
    sha256: str | None = None
    dali_index: str | None = None  # a file name beside the shard; None: gzip shards
    near: str | None = None


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its example count and its shards, in order."""

    name: str
    num_examples: int
    shards: tuple[ShardInfo, ...]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a reader needs of dataset_info.json (checked by ``parse_info``)."""

    format_version: int
    record_kind: str
    labels: tuple[str, ...]
    splits: tuple[SplitInfo, ...]
    compression: str = "none"
    path_root: str | None = None
    formats: tuple[str, ...] = ()
    label_feature: str | None = None  # record_kind example: the features of the label
    key_feature: str | None = None  # and key (None: none named at conversion)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.splits)

    def split(self, name: str) -> SplitInfo:
        """The split ``name``; a ``DatasetError`` naming the splits there are."""
        for s in self.splits:
            if s.name == name:
                return s
        names = ", ".join(self.split_names)
        raise DatasetError(f"split {name!r} not in the dataset; it has {names}")

    @classmethod
    def of(cls, info: dict) -> DatasetInfo:
        """The typed form of a dict ``parse_info`` checked."""
        splits = tuple(
            SplitInfo(
                name,
                s["num_examples"],
                tuple(
                    ShardInfo(
                        shard["file"],
                        shard["num_examples"],
                        shard["num_bytes"],
                        shard.get("sha256"),
                        shard.get("dali_index"),
                        shard.get("near"),
                    )
                    for shard in s.get("shards", [])
                ),
            )
            for name, s in info["splits"].items()
        )
        return cls(
            format_version=info["format_version"],
            record_kind=info["record_kind"],
            labels=tuple(info["labels"]),
            splits=splits,
            compression=info.get("compression", "none"),
            path_root=info.get("path_root"),
            formats=tuple(info.get("formats", ())),
            label_feature=info.get("label_feature"),
            key_feature=info.get("key_feature"),
        )


def parse_dataset_info(data: bytes | str, where: str = layout.INFO_FILE) -> DatasetInfo:
    """Parses and checks the text of a dataset_info.json (``schemas.info.parse_info``)."""
    return DatasetInfo.of(parse_info(data, where))


def load_dataset_info(data_dir: str) -> DatasetInfo:
    """Reads and checks ``data_dir/dataset_info.json`` (local or a URL), as
    ``schemas.info.load_info`` does.

    Raises:
        DatasetError: as ``load_info``.
    """
    return DatasetInfo.of(load_info(data_dir))
