"""The layout of a dataset folder: every file name, the shard-name rule, the format version.

```
OUT/
  train-00000-of-00016.tfrecord ...  (.tfrecord.gz with gzip compression)
  train-00000-of-00016.tfrecord.idx  DALI's record index, uncompressed shards only
  train-00000-of-00016.tfrecord.near near-duplicate fingerprints (--dedupe near)
  schema.pbtxt, labels.txt
  rejects/rejects.jsonl
  .incomplete/                        shards being written, and a record of each shard
                                      renamed into place (gone when done)
  .evenshard, .evenshard.lock         ownership marker; lock while a convert runs
  dataset_info.json                   written last: a finished dataset
```
"""

from __future__ import annotations

import re

from schemas.errors import InvalidValueError

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)

INFO_FILE = "dataset_info.json"
SCHEMA_FILE = "schema.pbtxt"
LABELS_FILE = "labels.txt"
REJECTS_FILE = "rejects/rejects.jsonl"
INCOMPLETE_DIR = ".incomplete"  # shards in the making; renamed into place when whole
MARKER_FILE = ".evenshard"  # written first: the folder is convert's (see owned files below)
LOCK_FILE = ".evenshard.lock"  # held while a convert writes the folder

COMPRESSIONS = ("none", "gzip")
_SUFFIXES = {"none": ".tfrecord", "gzip": ".tfrecord.gz"}

SHARD_NAME_RE = re.compile(
    r"^(?P<split>[A-Za-z0-9_]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord(\.gz)?$"
)
# A split name leaves room in a 255-byte file name for "-00000-of-00000.tfrecord.gz"
# and the temp and index suffixes; five digits number at most 99,999 shards.
MAX_SPLIT_NAME = 128
MAX_SHARDS = 99_999
SPLIT_NAME_RE = re.compile(rf"^[A-Za-z0-9_]{{1,{MAX_SPLIT_NAME}}}$")

# Glob patterns (relative to the output folder) of the names convert writes: a
# folder that is not convert's and holds one of them is refused, never emptied.
CLAIMED_PATTERNS = (
    "*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord*",
    SCHEMA_FILE,
    LABELS_FILE,
    REJECTS_FILE,
    f"{INCOMPLETE_DIR}/*",
)

# The files of fixed name a run writes; each is written through a temp file
# ``NAME.tmp-<32 hex digits>`` beside it (``temp_name``).
FIXED_FILES = (INFO_FILE, SCHEMA_FILE, LABELS_FILE, REJECTS_FILE, MARKER_FILE)
_TEMP_RE = re.compile(r"^(?P<name>.+)\.tmp-[0-9a-f]{32}$")

# Why a run ended without a dataset (too many rejects, say), one line: finalize writes
# it, the driver reads it after the run and fails with it (a worker never raises it).
REFUSED_FILE = f"{INCOMPLETE_DIR}/refused.txt"

# A shard renamed into place is first recorded as ``.incomplete/NAME.owned``,
# so the files of a run that died before dataset_info.json are known by name.
OWNED_SUFFIX = ".owned"
# A shard's near-duplicate fingerprints, one line a record (``schemas.near``).
NEAR_SUFFIX = ".near"


def temp_name(path: str, token: str) -> str:
    """The temp file a fixed file is written through: ``path.tmp-token``."""
    return f"{path}.tmp-{token}"


def is_temp_of_fixed_file(rel: str) -> bool:
    """``rel`` (relative to the dataset folder) is a temp file of a FIXED_FILES name."""
    m = _TEMP_RE.match(rel)
    return bool(m) and m.group("name") in FIXED_FILES


def shard_suffix(compression: str) -> str:
    """``.tfrecord`` or ``.tfrecord.gz``."""
    if compression not in _SUFFIXES:
        raise InvalidValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    return _SUFFIXES[compression]


def shard_name(split: str, index: int, count: int, compression: str = "none") -> str:
    """The one shard-name rule: ``train-00003-of-00016.tfrecord``."""
    if not SPLIT_NAME_RE.match(split):
        raise InvalidValueError(
            f"split name {split!r} may only use letters, digits and '_' (at most {MAX_SPLIT_NAME})"
        )
    if not 0 <= index < count:
        raise InvalidValueError(f"shard index {index} is not in [0, {count})")
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression)}"


INDEX_SUFFIX = ".idx"


def index_name(shard_file: str) -> str | None:
    """The DALI index beside an uncompressed shard (``offset size`` a record, the format
    of DALI's ``tfrecord2idx``); None for a compressed one: DALI reads uncompressed
    TFRecord only."""
    if not is_shard_name(shard_file):
        raise InvalidValueError(f"{shard_file!r} is not a shard file name")
    return None if shard_file.endswith(".gz") else shard_file + INDEX_SUFFIX


def beside(shard_file: str) -> list[str]:
    """The files that may lie beside a shard: its DALI index, its fingerprints."""
    return [n for n in (index_name(shard_file), shard_file + NEAR_SUFFIX) if n]


def is_shard_name(name: str) -> bool:
    """A plain file name that follows the shard-name rule (no folder part)."""
    return bool(SHARD_NAME_RE.match(name))


def is_url(path: str) -> bool:
    """A URL (``scheme://...``), not a local path."""
    return "://" in path


def join(data_dir: str, name: str) -> str:
    """``data_dir/name`` for local folders and URLs alike."""
    return f"{data_dir.rstrip('/')}/{name}"
