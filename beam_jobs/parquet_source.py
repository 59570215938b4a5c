"""Parquet files as inputs (issue 42), as Hugging Face ``datasets`` writes image
datasets: an image column of ``{bytes, path}`` structs, a label column (its
ClassLabel names in the file's ``huggingface`` metadata), any other columns.

Each file is read a row group at a time (pyarrow), the columns the rules use
only; a row's columns become features as a TFRecord's are (``_features``: an
image struct its bytes, or its path when it holds no bytes, text its UTF-8 bytes,
an integer an int64), so the same rules choose and read them (``record_rules``); a
path's file is read as the row is, from inside the input folder only. A row cannot
be read alone (a row group is the least Parquet reads), so each row's image is copied
as it is read, into one file a Parquet file in the run's ``.incomplete/`` (``_Copies``):
a row's place is (row, byte offset, length in the copy), by which the writer
reads it again with one ranged read (``images_again``). Damage: a file pyarrow cannot
open (cut short: no footer) is one reject at row 0; a row group that does not
read is one reject naming its first row, the row groups around it kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys

from beam_jobs.record_source import ReadRecordFile, as_inspected
from convert_core import paths
from convert_core.record_rules import IMAGE_PATH, RecordFormat, RecordRules
from convert_core.records import Image, make_reject
from schemas import storage
from schemas.errors import InvalidValueError
from schemas.images import Rejected


def _parquet():
    """pyarrow.parquet, imported though a local convert refuses pyarrow
    (``runners.lean_imports``: no other input needs it)."""
    for name in [n for n, m in sys.modules.items() if m is None and n.startswith("pyarrow")]:
        del sys.modules[name]
    import pyarrow.parquet as pq

    return pq


def _open(path: str):
    """The ParquetFile of ``path`` (close it: ``with``); a URL through ``schemas.storage``."""
    return _parquet().ParquetFile(storage.open_binary(path) if paths.is_url(path) else path)


def _value(value) -> tuple[str, list]:
    """A column's value as a feature: (kind, values)."""
    if value is None:
        return "", []
    if isinstance(value, dict) and "bytes" in value:  # an Image struct
        if value["bytes"] is not None:
            return "bytes", [value["bytes"]]
        # a path only: Dataset.to_parquet of a dataset made from files
        return (IMAGE_PATH, [value["path"]]) if value.get("path") else ("bytes", [])
    if isinstance(value, bool):
        return "other", [value]
    if isinstance(value, int):
        return "int64", [value]
    if isinstance(value, str):
        return "bytes", [value.encode("utf-8")]
    if isinstance(value, bytes):
        return "bytes", [value]
    return "other", [value]


def _features(row: dict) -> dict[str, tuple[str, list]]:
    return {name: _value(v) for name, v in row.items()}


def _columns(rules: RecordRules) -> list[str]:
    f = rules.features
    return sorted({f.image, f.label, *([f.key] if f.key else [])})


class _ReadParquetFile(ReadRecordFile):
    """Parquet file path -> Image | Reject, one a row, and one Reject for each damage."""

    def process(self, path: str):
        rel = paths.relative_to(self._root, path) or path
        try:
            pf = _open(path)
        except OSError as e:  # BeamIOError, or pyarrow's ArrowIOError
            if not type(e).__module__.startswith("pyarrow"):
                yield self.unreadable(f"{rel}#0", path, "row 0", e)
                return
            yield _damage(rel, path, 0, f"not a Parquet file, or cut short ({e})")
            return
        except Exception as e:  # noqa: BLE001 - ArrowInvalid: no Parquet footer
            yield _damage(rel, path, 0, f"not a Parquet file, or cut short ({e})")
            return
        with pf, _Copies(self._scratch, path) as copies:
            yield from self._rows(pf, path, rel, copies)

    def _rows(self, pf, path: str, rel: str, copies: _Copies):
        columns, first = _columns(self._rules), 0
        for group in range(pf.metadata.num_row_groups):
            try:
                rows = pf.read_row_group(group, columns=columns).to_pylist()
            except Exception as e:  # noqa: BLE001 - pyarrow's errors of a damaged page
                n = pf.metadata.row_group(group).num_rows
                yield _damage(rel, path, first, f"row group {group} ({n} rows) does not read ({e})")
                first += n
                continue
            for i, row in enumerate(rows):
                features = _features(row)
                kind, values = features.get(self._image, ("", []))
                n = first + i
                if kind == IMAGE_PATH:
                    try:
                        values = [self._read_path(path, values[0])]
                    except Rejected as r:
                        detail = f"row {n}: image {values[0]!r}: {r.detail}"
                        yield make_reject(f"{rel}#{n}", path, r.reason, detail)
                        continue
                    features[self._image] = kind, values = "bytes", values
                at, size = copies.put(values[0]) if kind == "bytes" and len(values) == 1 else (0, 0)
                yield self.record(path, f"{rel}#{n}", f"row {n}", features, (n, at, size))
            first += len(rows)

    def _read_path(self, path: str, named: str) -> bytes:
        """The image file a row of the Parquet file ``path`` names: an absolute path, or
        one relative to ``path``'s folder, inside the input folder.

        Raises:
            Rejected: bad_path (outside the input folder), missing, unreadable, too_large.
        """
        try:
            source = paths.resolve_inside(self._root, paths.posix_dirname(path), named)
        except paths.BadPath as e:
            raise Rejected("bad_path", str(e)) from None
        return self._inspector.read_whole(source)


class _Copies:
    """The images of one Parquet file's rows, copied as they are read, in order, into one
    file of the run's ``.incomplete/`` (``copy_name``), written whole
    (``schemas.storage.writer``: a read run twice writes the same bytes)."""

    def __init__(self, scratch: str, path: str):
        self._name = copy_name(scratch, path)
        self._file, self._out, self._at = contextlib.ExitStack(), None, 0

    def put(self, data: bytes) -> tuple[int, int]:
        """Appends ``data``; returns its (byte offset, length) in the copy."""
        if self._out is None:  # opened once (an empty first image leaves _at at 0)
            self._out = self._file.enter_context(storage.writer(self._name))
        self._out.write(data)
        self._at += len(data)
        return self._at - len(data), len(data)

    def __enter__(self) -> _Copies:
        return self

    def __exit__(self, *raised) -> None:
        self._file.__exit__(*raised)  # the copy lands only when every row was read


def copy_name(scratch: str, path: str) -> str:
    """The copy of the Parquet file ``path``'s images in ``scratch`` (the run's
    ``.incomplete/``, which the run removes as it ends)."""
    return f"{scratch}/{hashlib.blake2b(path.encode(), digest_size=8).hexdigest()}.rows"


def _damage(rel: str, path: str, row: int, problem: str):
    problem = " ".join(problem.split())  # pyarrow's messages run over lines
    detail = f"row {row}: {problem}; the rows of the other row groups are kept"
    return make_reject(f"{rel}#{row}", path, "corrupt", detail)


def _first(path: str) -> dict | None:
    """The features of the file's first row (an Image struct holding a path only: an
    ``IMAGE_PATH`` feature, not read here). Raises ValueError for a damaged file."""
    try:
        with _open(path) as pf:
            row = next(
                (r for g in range(pf.metadata.num_row_groups)
                 for r in pf.read_row_group(g).slice(0, 1).to_pylist()),
                None,
            )  # fmt: skip
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow's errors: a damaged file
        raise InvalidValueError(f"{path}: not a readable Parquet file ({e})") from None
    return None if row is None else _features(row)


def class_names(path: str, label: str) -> tuple[str, ...] | None:
    """The ClassLabel names of column ``label`` in the file's ``huggingface`` metadata."""
    with _open(path) as pf:
        metadata = pf.schema_arrow.metadata or {}
    try:
        info = json.loads(metadata.get(b"huggingface", b"{}"))
        feature = info.get("info", {}).get("features", {}).get(label, {})
        names = feature.get("names") if feature.get("_type") == "ClassLabel" else None
    except (ValueError, AttributeError):  # metadata not as datasets writes it
        return None
    return tuple(names) if names else None


def images_again(items: list[tuple[str, Image]], feature: str, scratch: str):
    """The images of a shard's rows (``items``: (file, Image), ``im.record``: (row, byte
    offset, length) in the file's copy in ``scratch``) read again from their copies,
    in order: (bytes, what changed since inspection or None) each; one ranged read a
    row."""
    for path, im in items:
        row, offset, length = im.record
        try:
            image = storage.read_range(copy_name(scratch, path), length, offset)
        except FileNotFoundError:
            yield b"", f"row {row}: its copy in {scratch} was removed after it was read"
            continue
        yield as_inspected(image, im, f"row {row}", "the copy's image")


FORMAT = RecordFormat(
    "parquet",
    "Parquet",
    _ReadParquetFile,
    _first,
    images_again,
    class_names=class_names,
    place=lambda record: f"row {record[0]}",
)
