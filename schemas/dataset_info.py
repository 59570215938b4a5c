"""``DatasetInfo``: ``dataset_info.json`` as typed, frozen values, parsed once.

    info = load_dataset_info(data_dir)       # checked by schemas.info.parse_info
    info.record_kind, info.compression, info.labels, info.inputs, info.rejects.total
    info.split("train").shards[0].num_bytes
    info.near_duplicates["clusters"]          # a field without a type of its own: read-only

``reader.load_info`` returns it. ``info["splits"]``-style access, as when it gave the
dict, still works for this release with a ``DeprecationWarning`` naming the attribute;
``info.to_dict()`` is the document as JSON holds it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from collections.abc import Mapping

from schemas import layout
from schemas.errors import InvalidTypeError
from schemas.info import DatasetError, load_info, parse_info


class ReadOnly(dict):
    """A JSON object, read-only: a dict (json.dumps and isinstance see one) whose
    changing methods raise. It pickles and copies (a mappingproxy would not pickle,
    and a reader goes to DataLoader workers and decode processes pickled)."""

    __slots__ = ()

    def _refused(self, *args, **kwargs):
        raise InvalidTypeError("a DatasetInfo is read-only: info.to_dict() is a copy to change")

    __setitem__ = __delitem__ = __ior__ = _refused
    clear = pop = popitem = setdefault = update = _refused

    def __reduce__(self):
        return ReadOnly, (dict(self),)

    def __repr__(self) -> str:
        return f"ReadOnly({dict.__repr__(self)})"

    __hash__ = None  # as a dict's


def frozen(value):
    """A JSON value made read-only: objects as read-only mappings, lists as tuples."""
    if isinstance(value, dict):
        return ReadOnly({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


_EMPTY: Mapping = ReadOnly({})


# read-only mappings are not hashable: a field holding one is left out of the hash
def _mapping(optional: bool = False):
    if optional:
        return dataclasses.field(default=None, hash=False)
    return dataclasses.field(default_factory=lambda: _EMPTY, hash=False)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard as dataset_info.json lists it (``file`` a name inside the dataset)."""

    file: str
    num_examples: int
    num_bytes: int
    sha256: str | None = None
    dali_index: str | None = None  # a file name beside the shard; None: gzip shards
    near: str | None = None
    label_counts: Mapping[str, int] = _mapping()


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its example count and its shards, in order."""

    name: str
    num_examples: int
    shards: tuple[ShardInfo, ...]
    num_bytes: int | None = None
    label_counts: Mapping[str, int] = _mapping()


@dataclasses.dataclass(frozen=True)
class RejectsInfo:
    """The inputs not written: how many, by reason, and the file that lists each."""

    total: int = 0
    by_reason: Mapping[str, int] = _mapping()
    file: str | None = None


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """dataset_info.json, checked (``parse_info``): typed attributes for every field
    convert writes; any other field (a later version's) as a read-only attribute too."""

    format_version: int
    record_kind: str
    labels: tuple[str, ...]
    splits: tuple[SplitInfo, ...]
    compression: str = "none"
    path_root: str | None = None
    formats: tuple[str, ...] = ()
    label_feature: str | None = None  # record_kind example: the features of the label
    key_feature: str | None = None  # and key (None: none named at conversion)
    inputs: int = 0  # inputs listed; each is written or rejected
    rejects: RejectsInfo = dataclasses.field(default_factory=RejectsInfo)
    seed: int | None = None
    input: str | None = None  # --input as given
    dedupe: str | None = None
    balance: str | None = None
    verify: str | None = None
    # how the splits and shards were made, what --dedupe near found (read-only dicts)
    split_options: Mapping | None = _mapping(optional=True)
    shard_options: Mapping | None = _mapping(optional=True)
    near_duplicates: Mapping | None = _mapping(optional=True)
    document: Mapping = dataclasses.field(default_factory=dict, repr=False, hash=False)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.splits)

    @property
    def num_examples(self) -> int:
        """Examples written, over all splits."""
        return sum(s.num_examples for s in self.splits)

    def split(self, name: str) -> SplitInfo:
        """The split ``name``; a ``DatasetError`` naming the splits there are."""
        for s in self.splits:
            if s.name == name:
                return s
        names = ", ".join(self.split_names)
        raise DatasetError(f"split {name!r} not in the dataset; it has {names}")

    def to_dict(self) -> dict:
        """The document as dataset_info.json holds it (a new dict: yours to change)."""
        return _thawed(self.document)

    def to_json(self) -> str:
        """dataset_info.json's text: sorted keys, two-space indents, one final newline
        (what convert writes: the same bytes for the same dataset)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def __getattr__(self, name: str):  # a field this version has no attribute for
        document = self.__dict__.get("document", _EMPTY)
        if name.startswith("_") or name not in document:
            if hasattr(dict, name):  # setdefault, update, pop, copy, ...
                raise AttributeError(
                    f"DatasetInfo has no {name}(): it is no longer a dict; info.to_dict() "
                    "is one (a copy), or read its attributes"
                )
            raise AttributeError(f"DatasetInfo has no field {name!r}")
        return document[name]

    # The dict it used to be, for a release: each use warns, naming the attribute. One
    # plain dict, made at the first use: changing it changes what these give, as
    # changing the dict did, and never the attributes.
    _plain_dict = None  # (not a field)

    def _plain(self) -> dict:
        plain = self._plain_dict
        if plain is None:
            plain = self.to_dict()
            object.__setattr__(self, "_plain_dict", plain)
        return plain

    def __getitem__(self, key: str):
        _deprecated(f"info[{key!r}]", key, self.document)
        return self._plain()[key]

    def get(self, key: str, default=None):
        _deprecated(f"info.get({key!r})", key, self.document)
        return self._plain().get(key, default)

    def __contains__(self, key: str) -> bool:
        _deprecated(f"{key!r} in info", key, self.document)
        return key in self.document

    def __iter__(self):
        _deprecated("iterating over info", None, self.document)
        return iter(self._plain())

    def __len__(self) -> int:
        _deprecated("len(info)", None, self.document)
        return len(self.document)

    def __bool__(self) -> bool:
        return True

    def keys(self):
        _deprecated("info.keys()", None, self.document)
        return self._plain().keys()

    def values(self):
        _deprecated("info.values()", None, self.document)
        return self._plain().values()

    def items(self):
        _deprecated("info.items()", None, self.document)
        return self._plain().items()

    def __getstate__(self) -> dict:  # the dict made for dict access is not the info
        return {k: v for k, v in self.__dict__.items() if k != "_plain_dict"}

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
                        frozen(shard.get("label_counts", {})),
                    )
                    for shard in s.get("shards", [])
                ),
                s.get("num_bytes"),
                frozen(s.get("label_counts", {})),
            )
            for name, s in info["splits"].items()
        )
        rejects = info.get("rejects") or {}
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
            inputs=info.get("inputs", 0),
            rejects=RejectsInfo(
                rejects.get("total", 0), frozen(rejects.get("by_reason", {})), rejects.get("file")
            ),
            seed=info.get("seed"),
            input=info.get("input"),
            dedupe=info.get("dedupe"),
            balance=info.get("balance"),
            verify=info.get("verify"),
            split_options=frozen(info.get("split_options")),
            shard_options=frozen(info.get("shard_options")),
            near_duplicates=frozen(info.get("near_duplicates")),
            document=frozen(info),
        )


_INSTEAD = {
    "splits": "info.split(name) (a SplitInfo: .num_examples, .shards; info.splits is "
    "a tuple of them)",
    "rejects": "info.rejects (.total, .by_reason, .file)",
}


def _deprecated(use: str, key: str | None, document: Mapping) -> None:
    if key is not None and key in document:
        instead = _INSTEAD.get(key, f"info.{key}")
    else:  # no such field, or the dict as a whole
        instead = "info.to_dict() (a dict), or the attributes"
    warnings.warn(
        f"{use}: DatasetInfo is no longer a dict, and its dict access goes in the next "
        f"release: use {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


def _thawed(value):
    """A read-only JSON value (``frozen``) as plain dicts and lists again."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return copy.copy(value)


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
