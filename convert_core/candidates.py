"""What an input becomes: a :class:`Candidate`, or a :class:`Reject` with its reason.

The rules a listed file (``CandidateRules.file``) or a manifest row
(``CandidateRules.row``) must pass before any image is opened: a key and
path that are text, a supported extension, a label (and split) that can be
written, the file under ``--path_root`` for path records. Also the manifest
formats (CSV with a header, JSONL) read row by row. Plain Python: no Beam.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os

from convert_core import paths
from convert_core.options import is_csv
from convert_core.records import Candidate, Reject, make_reject
from schemas.images import IMAGE_EXTENSIONS
from schemas.layout import MAX_SPLIT_NAME, SPLIT_NAME_RE

# A CSV field may hold up to 16 MiB (the csv module's default is 128 KiB): a
# longer path or label is then rejected by its row's checks, not by a crash.
csv.field_size_limit(1 << 24)


def manifest_columns(path: str, f: io.TextIOBase) -> tuple[list[str], bool]:
    """(CSV header columns, or []: JSONL), and whether a row follows."""
    if is_csv(path):
        rows = csv.reader(f)
        header = [c.strip() for c in next(rows, [])]
        return header, any(any(v.strip() for v in row) for row in rows)
    return [], any(line.strip() for line in f)


class NotText(str):
    """A JSONL value that is not a string or a whole number (true, an object, NaN, 1.5)."""


def text_value(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return NotText(json.dumps(value))


def bad_label(label: str, vocabulary: frozenset[str] | None) -> str | None:
    if isinstance(label, NotText):
        return f"label {label} is not a string or a whole number"
    if not label:
        return "label is empty"
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return "label is not valid UTF-8 (a lone surrogate)"
    if "\x00" in label or len(label.splitlines()) != 1:
        # str.splitlines() also breaks at \v \f \x1c-\x1e \x85 U+2028 U+2029: such a
        # label would read back as two lines of labels.txt
        return "label holds a line break (any that str.splitlines() splits at) or NUL"
    if label != label.strip():
        return "label has leading or trailing spaces"
    if vocabulary is not None and label not in vocabulary:
        return f"label {label!r} is not in the --labels vocabulary"
    return None


def rows_of(manifest: str, f):
    """Yields (row number, dict or error text); blank lines are skipped.

    A row is a line of the file: a CSV record over several lines (a quoted field
    with a line break, usually a stray quote) is an error for each line it took.
    """
    if is_csv(manifest):
        yield from _csv_rows(f)
        return
    for number, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            yield number, f"not valid JSON: {e}"
            continue
        if not isinstance(row, dict):
            yield number, "line is not a JSON object"
        else:
            yield number, {k: text_value(v) for k, v in row.items()}


def _csv_rows(f):
    taken: list[str] = []  # the lines of the record being read
    reader = csv.reader(_recorded(f, taken))
    header = [c.strip() for c in next(reader, [])]
    while True:
        taken.clear()
        first = reader.line_num + 1
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # a field over 16 MiB: this row only
            yield from _line_by_line(first, taken, f"row cannot be parsed as CSV: {e}")
            continue
        if len(taken) > 1:
            problem = "a quoted field holds a line break (a stray quote?); one row a line"
            yield from _line_by_line(first, taken, problem)
        elif not any(v.strip() for v in values):
            continue
        elif len(values) != len(header):
            yield first, f"row has {len(values)} fields, the header has {len(header)}"
        else:
            yield first, {k: v for k, v in zip(header, values) if k}


def _recorded(lines, into: list[str]):
    """``lines``, each also appended to ``into``."""
    for line in lines:
        into.append(line)
        yield line


def _line_by_line(first: int, lines: list[str], problem: str):
    """A CSV record read from ``lines`` (starting at line ``first``): ``problem`` for its
    first line and a row error for each other non-blank line, so every line is counted."""
    last = first + len(lines) - 1
    if last == first:
        yield first, problem
        return
    yield first, f"{problem}: the row runs over lines {first}-{last}, each is rejected"
    for number, line in enumerate(lines[1:], start=first + 1):
        if line.strip():
            yield number, f"taken into row {first}, which runs over lines {first}-{last}"


@dataclasses.dataclass(frozen=True)
class CandidateRules:
    """The job's rules for inputs: its roots (resolved: ``Job.input_root``,
    ``Job.path_root``), record kind, ``--labels`` vocabulary and group column."""

    root: str
    path_root: str | None
    kind: str
    vocabulary: frozenset[str] | None
    group_by: str | None

    def file(self, source: str) -> Candidate | Reject:
        """A file of an image folder: its label is its first-level sub-folder."""
        rel = paths.relative_to(self.root, source)
        compact = "" if rel else source  # under the root: root/key (``paths.compact_source``)
        rel = rel or source
        try:
            paths.check_text(rel)
        except paths.BadPath as e:
            return make_reject(rel, source, "bad_path", str(e))
        if not rel.lower().endswith(IMAGE_EXTENSIONS):
            ext = os.path.splitext(rel)[1] or "(none)"
            return make_reject(rel, source, "unsupported_format", f"file extension {ext}")
        parts = rel.split("/")
        if len(parts) < 2:
            return make_reject(rel, source, "bad_label", "file is not inside a label sub-folder")
        return self._candidate(rel, source, compact, parts[0])

    def row(self, number: int, row: dict | str) -> Candidate | Reject:
        """Row ``number`` of a manifest (``rows_of``: a dict, or why it cannot be read).

        Relative paths resolve against the manifest's folder and may not leave
        it; absolute paths and URLs are used as given.
        """
        row_key, where = f"row:{number}", f"row {number}"
        if isinstance(row, str):
            return make_reject(row_key, where, "malformed_row", row)
        path = row.get("path", "").strip()
        if not path:
            return make_reject(row_key, where, "malformed_row", "path is empty or missing")
        for name in ("path", "key", "split", self.group_by):
            if isinstance(row.get(name), NotText):
                detail = f"{name} {row[name]} is not a string or a whole number"
                return make_reject(row_key, where, "malformed_row", detail)
        key = row.get("key", "").strip() or paths.normalize_key(path)
        try:
            paths.check_text(key)
        except paths.BadPath as e:
            return make_reject(row_key, where, "bad_path", f"key: {e}")
        try:
            source = paths.resolve(self.root, path)
        except paths.BadPath as e:
            return make_reject(key, path, "bad_path", str(e))
        split = row.get("split", "").strip() or None
        group = None
        if self.group_by:  # an empty group value: the row is a group of its own (its key)
            group = row.get(self.group_by, "").strip() or None
        compact = paths.compact_source(self.root, source, key)
        return self._candidate(key, source, compact, row.get("label", ""), split, group, number)

    def _candidate(
        self,
        key: str,
        source: str,
        compact: str,
        label: str,
        split=None,
        group=None,
        number: int = 0,
    ) -> Candidate | Reject:
        """The rules every input shares: its label (and split), and for path records its
        place under the path root; then the Candidate of ``source`` (``compact``: as it
        travels, ``paths.compact_source``)."""
        problem = bad_label(label, self.vocabulary)
        if problem:
            return make_reject(key, source, "bad_label", problem)
        if split is not None and not SPLIT_NAME_RE.match(split):
            return make_reject(
                key,
                source,
                "bad_split",
                f"split {split[:40]!r} is not a valid name (letters, digits, '_'; at most "
                f"{MAX_SPLIT_NAME})",
            )
        rel_path = ""
        if self.kind == "path":
            rel_path = paths.relative_to(self.path_root, source)
            if rel_path is None:
                where = f"not under --path_root {self.path_root}"
                return make_reject(key, source, "bad_path", where)
        return Candidate(key, compact, rel_path, label, split, group, number)
