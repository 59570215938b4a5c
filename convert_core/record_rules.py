"""What a record of a TFRecord input becomes (issue 42): the features that are the
image, the label and the key (chosen once, in the driver, from the first record:
``choose_features``), and each record's key, image and label, or why it is a
reject (``RecordRules.read``). Plain Python: no Beam.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable

from convert_core import paths
from convert_core.candidates import bad_label
from convert_core.options import RECORD_FORMATS, UserError
from schemas.errors import Error
from schemas.images import IMAGE_EXTENSIONS, MAGIC

GLOB_CHARS = "*?["

# A feature kind beside int64 and bytes: the path of the image's file, which the
# format's reader reads (Parquet's Image structs that hold a path and no bytes)
IMAGE_PATH = "image_path"

# The largest int label without --labels: an int label is its own id, so labels.txt
# lists 0 to the largest seen; a hashed or huge int would be that many names.
MAX_LABEL_ID = (1 << 20) - 1


def is_glob(path: str) -> bool:
    return any(c in path for c in GLOB_CHARS)


def glob_root(path: str) -> str:
    """The folder above a glob's first wildcard (keys are relative to it); a folder
    itself when ``path`` is no glob."""
    if not is_glob(path):
        return path
    head = path[: min(path.find(c) for c in GLOB_CHARS if c in path)]
    return paths.posix_dirname(head) if "/" in head else "."


def _visible(parts: list[str]) -> bool:
    return not any(p.startswith(".") for p in parts)


def is_named(rel: str, patterns: tuple[str, ...]) -> bool:
    """A file of a folder given as ``--input`` (``rel``: its path relative to it) is one
    of a record format: visible, its name matching one of the format's ``patterns``
    (``RecordInput.names``), in any case."""
    parts = rel.split("/")
    name = parts[-1].lower()
    return _visible(parts) and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def record_input_formats(names: list[str]) -> dict[str, list[str]]:
    """The record ``--input_format`` a folder of files ``names`` (relative to it) is of
    when none is an image: format -> its files, sorted (several formats: each). {} when
    a file is an image or none is a record file: an image folder, its other files
    ``unsupported_format`` rejects. A format known by the files beside its records
    (``RecordInput.beside``: a TFDS version folder) stands for the one of the same
    names."""
    if any(n.lower().endswith(IMAGE_EXTENSIONS) for n in names):
        return {}
    found = {}
    for fmt, row in RECORD_FORMATS.items():
        files = sorted(n for n in names if is_named(n, row.names))
        if files and set(row.beside) <= set(names):
            found[fmt] = files
    for fmt, row in RECORD_FORMATS.items():
        if row.beside and fmt in found:
            alike = [f for f in found if f != fmt and RECORD_FORMATS[f].names == row.names]
            found = {f: files for f, files in found.items() if f not in alike}
    return found


def _no_class_names(path: str, label: str) -> None:
    return None


def _byte(record: tuple) -> str:
    return f"byte {record[0]}"


@dataclasses.dataclass(frozen=True)
class RecordFormat:
    """What convert needs of one format of record files (its source module's ``FORMAT``).

    Attributes:
        name: its ``--input_format``: its row of ``RECORD_FORMATS`` names its files.
        what: its name in messages (``TFRecord``).
        reader: the DoFn class reading a file (``record_source.ReadRecordFile``).
        first: a file's first record's features (``parse_features``' shape), None when
            it holds none; raises OSError or ValueError for a damaged file.
        images_again: ([(file, Image)] of a shard, image feature, the run's
            ``.incomplete/``) -> (bytes, what changed or None) of each, in order: the
            writer's second read.
        class_names: (file, label feature) -> the label's class names the file
            declares, or None (by default, none).
        place: an ``Image.record`` in words (by default ``byte 120``).
        label_names: the names of its label features (WebDataset's ``cls``), chosen
            as ``*label*`` ones are.
        feature_defaults: (the input's folder, --input_split) -> (image, label)
            features the input's own description names (TFDS's features.json), after
            checking it; None: the records' first features decide.
        files: a folder's files of it, in words (by default its row's name patterns).
    """

    name: str
    what: str
    reader: type
    first: Callable[[str], dict | None]
    images_again: Callable
    class_names: Callable[[str, str], tuple[str, ...] | None] = _no_class_names
    place: Callable[[tuple], str] = _byte
    label_names: tuple[str, ...] = ()
    feature_defaults: Callable[[str, str | None], tuple[str | None, str | None]] | None = None
    files: str = ""

    def __post_init__(self):
        if not self.files:
            object.__setattr__(self, "files", ", ".join(RECORD_FORMATS[self.name].names))

    def named(self, rel: str) -> bool:
        """Whether a folder's file (its path relative to the folder) is one."""
        return is_named(rel, RECORD_FORMATS[self.name].names)


@dataclasses.dataclass(frozen=True)
class RecordFeatures:
    """The features of the input's records that are the image, the label (its kind:
    ``int64`` or ``bytes``), the key (None: ``FILE#INDEX``) and the ``--group_by`` group
    (None: none). ``--record_kind example`` has no image (None) and a label only when
    named (None: none, kind "")."""

    image: str | None
    label: str | None
    label_kind: str
    key: str | None = None
    group: str | None = None


def _single(found: dict, kind: str) -> list[str]:
    return sorted(n for n, (k, values) in found.items() if k == kind and len(values) == 1)


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def choose_features(
    found: dict[str, tuple[str, list]],
    image: str | None,
    label: str | None,
    key: str | None,
    label_names: tuple[str, ...] = (),
) -> RecordFeatures:
    """The features named by the flags, else the one that fits: the image is the
    bytes feature whose value starts as an image does, or the one ``IMAGE_PATH``
    feature; the label the int64 or text
    feature named ``*label*`` or one of ``label_names`` (the format's: WebDataset's
    ``cls``), else the only int64 or text feature left (none named ``__*``, a
    WebDataset sample's ``__key__``); no key unless one is named ``key`` or ``*/key``.
    ``found``: a record's ``schemas.example.parse_features``.

    Raises:
        UserError: a named feature the record lacks, or none or several that fit,
            in one line listing the candidates and the flag to use.
    """
    names = ", ".join(sorted(found)) or "none"

    def named(flag: str, name: str, kinds: tuple[str, ...]) -> str:
        if found.get(name, ("", []))[0] not in kinds:
            raise UserError(
                f"--{flag}: the first record has no {' or '.join(kinds)} feature {name!r}; "
                f"its features: {names}"
            )
        return name

    def one(flag: str, what: str, fits: list[str]) -> str:
        if len(fits) == 1:
            return fits[0]
        if not fits:
            raise UserError(
                f"--{flag}: no feature of the first record is {what}; its features: {names}"
            )
        raise UserError(
            f"several features could be {what} ({', '.join(fits)}): name one with --{flag}"
        )

    if image:
        image = named("image_feature", image, ("bytes", IMAGE_PATH))
    else:
        images = [n for n in _single(found, "bytes") if found[n][1][0].startswith(MAGIC)]
        images += _single(found, IMAGE_PATH)
        if "image" in images:  # a feature of the same value is an alias of it (WebDataset's)
            images = [n for n in images if n == "image" or found[n] is not found["image"]]
        image = one("image_feature", "the image", images)
    if key:
        key = named("key_feature", key, ("bytes",))
    else:
        keys = [n for n in _single(found, "bytes") if n == "key" or n.endswith("/key")]
        key = keys[0] if len(keys) == 1 and keys[0] != image else None
    if label:
        label = named("label_feature", label, ("int64", "bytes"))
    else:
        texts = [n for n in _single(found, "bytes") if _is_text(found[n][1][0])]
        aliases = {n for n in found if n != image and found[n] is found[image]}
        fits = sorted({*_single(found, "int64"), *texts} - {image, key} - aliases)
        fits = [n for n in fits if not n.startswith("__")]
        labelled = [n for n in fits if "label" in n.lower() or n in label_names]
        label = one("label_feature", "the label", labelled or fits)
    return RecordFeatures(image, label, found[label][0], key)


class RecordProblem(Error):
    """Why a record is a reject: ``reason`` (``records.REJECT_REASONS``) and ``detail``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclasses.dataclass(frozen=True)
class RecordRules:
    """The rules of the input's records: its chosen ``features`` and the vocabulary
    (an int label is a position in it), named in messages as ``vocabulary_from``
    (``--labels``, or the class names Parquet or TFDS declare)."""

    features: RecordFeatures
    vocabulary: tuple[str, ...] | None = None
    vocabulary_from: str = "--labels"

    def key(self, found: dict[str, tuple[str, list]], default: str) -> str:
        """A record's key: its key feature's text, or ``default`` (``FILE#INDEX``).

        Raises:
            RecordProblem: a key feature missing, empty or not UTF-8 text.
        """
        f = self.features
        if f.key is None:
            return default
        value = self._one(found, f.key, "bytes", "bad_path")
        if not value or not _is_text(value):
            raise RecordProblem("bad_path", f"key feature {f.key!r} is empty or not UTF-8 text")
        key = value.decode("utf-8")
        try:
            paths.check_text(key)
        except paths.BadPath as e:
            raise RecordProblem("bad_path", f"key: {e}") from None
        return key

    def label(self, found: dict[str, tuple[str, list]]) -> str:
        """A record's label text (an int label: its line of ``--labels``, else itself).

        Raises:
            RecordProblem: a label missing, of the other kind, or unusable.
        """
        f = self.features
        if f.label is None:  # --record_kind example without --label_feature
            return ""
        value = self._one(found, f.label, f.label_kind, "bad_label")
        if f.label_kind == "int64":
            if value < 0 or (self.vocabulary and value >= len(self.vocabulary)):
                n = len(self.vocabulary or ())
                where = f"ids 0 to {n - 1}: {n} in {self.vocabulary_from}" if n else "ids >= 0"
                raise RecordProblem("bad_label", f"label {value} is out of range ({where})")
            if not self.vocabulary and value > MAX_LABEL_ID:
                raise RecordProblem(
                    "bad_label",
                    f"label {value} is past {MAX_LABEL_ID}, the largest int label without "
                    "--labels (labels.txt lists 0 to the largest); give --labels, or text labels",
                )
            label = self.vocabulary[value] if self.vocabulary else str(value)
        else:
            if not _is_text(value):
                raise RecordProblem("bad_label", "label is not UTF-8 text")
            label = value.decode("utf-8")
            problem = bad_label(label, frozenset(self.vocabulary) if self.vocabulary else None)
            if problem:
                raise RecordProblem("bad_label", problem)
        return label

    def group(self, found: dict[str, tuple[str, list]]) -> str | None:
        """A record's ``--group_by`` group: its group feature's one value as text (an int
        as digits); None (the record a group of its own, as a manifest's empty value)
        when it has none or no one value.

        Raises:
            RecordProblem: a group value that is not UTF-8 text (``bad_split``).
        """
        name = self.features.group
        kind, values = found.get(name, ("", [])) if name else ("", [])
        if kind not in ("int64", "bytes") or len(values) != 1:
            return None
        if kind == "int64":
            return str(values[0])
        if not _is_text(values[0]):
            raise RecordProblem("bad_split", f"group feature {name!r} is not UTF-8 text")
        return values[0].decode("utf-8") or None

    @staticmethod
    def image_of(found: dict[str, tuple[str, list]], feature: str) -> bytes:
        """The image bytes of a record's features, or a ``missing`` RecordProblem."""
        return RecordRules._one(found, feature, "bytes", "missing")

    @staticmethod
    def _one(found: dict, name: str, kind: str, reason: str):
        got, values = found.get(name, ("", []))
        if got != kind or len(values) != 1:
            has = f"{got or 'no'} feature with {len(values)} values" if name in found else "none"
            raise RecordProblem(reason, f"feature {name!r}: one {kind} value expected, {has}")
        return values[0]
