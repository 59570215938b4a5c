"""Reads the inputs: an image folder or a CSV/JSONL manifest.

``ReadInputs`` yields one :class:`Candidate` per input plus ``rejects``
for inputs that fail before any file is opened (bad label, bad path,
unsupported extension, malformed manifest row, duplicate key). Every input is
in exactly one of the two; that is what makes ``inputs = written + rejects``
reconcile.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_jobs import paths
from beam_jobs.dead_letters import SplitRejects
from beam_jobs.options import ConvertOptions, Job, UserError
from beam_jobs.records import Candidate, Reject, make_reject
from schemas.images import IMAGE_EXTENSIONS
from schemas.layout import MAX_SPLIT_NAME, SPLIT_NAME_RE
from schemas.progress import Progress


def input_root(options: ConvertOptions) -> str:
    """The folder keys and relative paths are measured from."""
    if options.is_manifest:
        return paths.normalize_root(paths.posix_dirname(options.input))
    return paths.normalize_root(options.input)


def check_input(options: ConvertOptions) -> list[str]:
    """Checks the input exists (and a manifest's header) in the driver.

    Returns:
        The manifest's column names ([] for an image folder).

    Raises:
        UserError: missing folder or manifest, or a manifest without the
            required columns.
    """
    if paths.is_url(options.input):
        try:
            FileSystems.get_filesystem(options.input)
        except ValueError:
            scheme = options.input.split("://", 1)[0]
            raise UserError(
                f"--input {options.input}: {scheme}:// is not a file system Beam reads; give a "
                "local path or a gs:// URL (s3:// with apache-beam[aws])"
            ) from None
    if not options.is_manifest:
        root = input_root(options)
        if paths.is_url(root):
            if not FileSystems.match([root + "/**"], limits=[1])[0].metadata_list:
                raise UserError(f"--input: no files under {root}")
        elif os.path.exists(root) and not os.path.isdir(root):
            raise UserError(
                f"--input: {options.input!r} is a file, not a folder; give an image folder, "
                "or a manifest ending .csv, .jsonl, .csv.gz or .jsonl.gz"
            )
        elif not os.path.isdir(root):
            raise UserError(f"--input: folder {options.input!r} does not exist")
        elif not any(files for _, _, files in os.walk(root, followlinks=True)):
            raise UserError(f"--input: folder {options.input!r} holds no files")
        return []
    if not paths.is_url(options.input) and os.path.isdir(options.input):
        raise UserError(
            f"--input: {options.input!r} is a folder, not a manifest file; "
            "give the folder without a manifest suffix, or a .csv/.jsonl file"
        )
    if not FileSystems.exists(options.input):
        raise UserError(f"--input: manifest {options.input!r} does not exist")
    try:
        with _open_text(options.input, errors="surrogateescape") as f:
            columns, has_rows = _manifest_columns(options.input, f)
    except (UnicodeDecodeError, OSError, EOFError, csv.Error) as e:
        raise UserError(f"--input: manifest {options.input} cannot be read: {e}") from None
    if not has_rows:
        raise UserError(f"--input: manifest {options.input} lists no inputs")
    if not is_csv(options.input):
        return columns  # JSONL: each row is checked on its own (malformed_row)
    # Columns without a name (a spreadsheet's trailing empty columns) are ignored.
    named = [c for c in columns if c]
    if len(set(named)) != len(named):
        twice = sorted({c for c in named if named.count(c) > 1})
        raise UserError(
            f"--input: manifest {options.input} names column(s) {', '.join(twice)} twice"
        )
    missing = [c for c in ("path", "label") if c not in columns]
    if options.group_by:
        missing += [] if options.group_by in columns else [options.group_by]
    if missing:
        raise UserError(
            f"--input: manifest {options.input} lacks column(s) {', '.join(missing)}; "
            f"it has {', '.join(columns) or 'none'}"
        )
    return columns


def has_at_least(options: ConvertOptions, n: int) -> bool:
    """Whether the input lists at least ``n`` entries; stops counting at ``n``.

    Cheap by construction: a walk or a read that ends early on large inputs.
    URLs count as large (listing a bucket twice costs requests). Errors count
    as small: preflight reports them properly.
    """
    if paths.is_url(options.input):
        return True
    count = 0
    try:
        if options.is_manifest:
            lines = n + 1 if is_csv(options.input) else n  # a CSV's header is no input
            with _open_text(options.input) as f:
                for line in f:
                    count += bool(line.strip())
                    if count >= lines:
                        return True
            return False
        for _, _, files in os.walk(options.input, followlinks=True):
            count += len(files)
            if count >= n:
                return True
    except (OSError, UnicodeDecodeError, EOFError):
        return False
    return False


def _open_text(path: str, errors: str = "strict") -> io.TextIOBase:
    """A text stream of a manifest or labels file; ``.gz`` files are gunzipped.

    Opened uncompressed and unzipped here: Beam's own decompressing stream
    lacks what ``io.TextIOWrapper`` needs. ``errors="surrogateescape"`` keeps
    bytes that are not UTF-8 as lone surrogates, which the row checks reject
    (``bad_path``, ``bad_label``) row by row.
    """
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.lower().endswith(".gz"):
        raw = gzip.GzipFile(fileobj=raw, mode="rb")
    # utf-8-sig drops a BOM; newline="" lets csv handle CRLF line ends.
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors=errors, newline="")


# A CSV field may hold up to 16 MiB (the csv module's default is 128 KiB): a
# longer path or label is then rejected by its row's checks, not by a crash.
csv.field_size_limit(1 << 24)


def is_csv(path: str) -> bool:
    """The manifest format, by suffix: ``.csv``/``.csv.gz`` (else ``.jsonl``/``.jsonl.gz``)."""
    return path.lower().removesuffix(".gz").endswith(".csv")


def _manifest_columns(path: str, f: io.TextIOBase) -> tuple[list[str], bool]:
    """(CSV header columns, or []: JSONL), and whether a row follows."""
    if is_csv(path):
        rows = csv.reader(f)
        header = [c.strip() for c in next(rows, [])]
        return header, any(any(v.strip() for v in row) for row in rows)
    return [], any(line.strip() for line in f)


def load_vocabulary(path: str) -> list[str]:
    """Reads a ``--labels`` file: one label a line; blank lines ignored."""
    if not paths.is_url(path) and os.path.isdir(path):
        raise UserError(f"--labels: {path!r} is a folder; give a file with one label a line")
    if not FileSystems.exists(path):
        raise UserError(f"--labels: file {path!r} does not exist")
    try:
        with _open_text(path) as f:
            labels = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise UserError(f"--labels: file {path!r} is not UTF-8 text ({e.reason})") from None
    if not labels:
        raise UserError(f"--labels: file {path!r} holds no labels")
    if len(set(labels)) != len(labels):
        raise UserError(f"--labels: file {path!r} lists a label twice")
    return labels


class _NotText(str):
    """A JSONL value that is not a string or a whole number (true, an object, NaN, 1.5)."""


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _NotText(json.dumps(value))


def _bad_label(label: str, vocabulary: frozenset[str] | None) -> str | None:
    if isinstance(label, _NotText):
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


class _Links(NamedTuple):
    """What pass 1 of a folder walk leaves to pass 2: symlinks (paths) and the
    folders it could not list (paths relative to the root)."""

    links: tuple
    unlisted: tuple


def listing_work(root: str) -> list[tuple[str, str]]:
    """The work items of listing an image folder, walked in parallel.

    Local: ("top", "") for the root's own entries, ("tree", name) for each
    visible real sub-folder (a label). A URL: one ("url", "") item.
    """
    if paths.is_url(root):
        return [("url", "")]
    with os.scandir(root) as it:
        folders = [e.name for e in it if not e.name.startswith(".") and _is_folder(e)]
    return [("top", ""), *(("tree", name) for name in sorted(folders))]


class _ListImageFolder(beam.DoFn):
    """work item (``listing_work``) -> chunks of Candidate | Reject, and _Links.

    Label = first-level sub-folder. Hidden files and folders are ignored (not
    inputs). Local folders are walked here rather than with FileSystems.match,
    whose local listing silently drops files it cannot stat (broken symlinks,
    symlink loops): those must become rejects, not vanish. The label folders
    are walked in parallel (pass 1, ``_walk_tree``); the symlinks they hold
    are followed afterwards, all in one place (``follow``).
    """

    def __init__(self, job: Job):
        self._root = job.input_root
        self._kind = job.options.record_kind
        self._path_root = job.path_root
        self._vocabulary = frozenset(job.vocabulary) if job.vocabulary else None
        self._listed = Metrics.counter("evenshard", "files_listed")

    def process(self, item: tuple[str, str]):
        kind, name = item
        if kind == "url":
            yield from chunked(self._listing(_walk_url(self._root)))
            return
        links: list[str] = []
        unlisted: list[str] = []
        walk = _walk_tree(self._root, name, links, unlisted, recurse=kind == "tree")
        yield from chunked(self._listing(walk))
        if links or unlisted:
            yield _Links(tuple(links), tuple(unlisted))

    def follow(self, found: list):
        """All the walk's _Links -> chunks of the files reached through symlinks."""
        links = sorted(link for f in found for link in f.links)
        unlisted = frozenset(u for f in found for u in f.unlisted)
        yield from chunked(self._listing(_follow_links(self._root, links, unlisted)))

    def _listing(self, walk):
        progress = Progress("list", "files")
        root = self._root
        for source, rejected in walk:
            self._listed.inc()
            progress.add()
            if rejected is None:
                yield self._candidate(root, self._path_root, source)
            else:
                yield _reject(paths.relative_to(root, source) or source, source, *rejected)

    def _candidate(self, root: str, path_root: str, source: str):
        rel = paths.relative_to(root, source) or source
        parts = rel.split("/")
        try:
            paths.check_text(rel)
        except paths.BadPath as e:
            return _reject(rel, source, "bad_path", str(e))
        if not rel.lower().endswith(IMAGE_EXTENSIONS):
            ext = os.path.splitext(rel)[1] or "(none)"
            return _reject(rel, source, "unsupported_format", f"file extension {ext}")
        if len(parts) < 2:
            return _reject(rel, source, "bad_label", "file is not inside a label sub-folder")
        problem = _bad_label(parts[0], self._vocabulary)
        if problem:
            return _reject(rel, source, "bad_label", problem)
        rel_path = ""
        if self._kind == "path":
            rel_path = paths.relative_to(path_root, source)
            if rel_path is None:
                return _reject(rel, source, "bad_path", f"not under --path_root {path_root}")
        return Candidate(
            key=rel,
            source=paths.compact_source(root, source, rel),
            rel_path=rel_path,
            label=parts[0],
        )


def _visible(names: list[str]) -> list[str]:
    return sorted(n for n in names if not n.startswith("."))


def _walk_url(root: str):
    """A bucket folder: every object under it that is not hidden is an input."""
    for meta in FileSystems.match([root + "/**"])[0].metadata_list:
        rel = paths.relative_to(root, meta.path)
        if rel and not any(p.startswith(".") for p in rel.split("/")):
            yield meta.path, None


def _walk_tree(root: str, name: str, links: list[str], unlisted: list[str], recurse: bool):
    """Pass 1 of a folder walk: the real tree, symlinks not followed.

    ``name``: a sub-folder of root ("" for root itself); ``recurse`` False
    lists root's own entries only. Files are inputs; symlinks are appended to
    ``links`` and folders that cannot be listed (one ``unreadable`` reject
    each) to ``unlisted``, for pass 2.
    """
    start = f"{root}/{name}" if name else root
    for path, rel, error in _real_files(start, links, name, recurse):
        if error is not None:  # a folder that cannot be listed: its files are unknown
            unlisted.append(rel)
            yield path, ("unreadable", f"folder cannot be listed ({error})")
        else:
            yield path, None


def _follow_links(root: str, links: list[str], unlisted: frozenset[str]):
    """Pass 2: follows the symlinks (to files and folders), level by level, each
    level sorted.

    A file whose real path pass 1 listed is an alias (``a_alias -> real_b``
    yields real_b's files as ``duplicate_file`` rejects, so they are neither
    lost nor written twice); a file outside the tree is an input. A folder
    link to its own ancestor is one ``unreadable`` reject (a loop), a second
    link to a folder already walked one ``duplicate_file``. Broken symlinks
    are inputs, for inspection to reject as missing or unreadable. Pass 1's
    files are recognised by their real path (``_listed_by_pass_1``), so the
    label folders can be walked apart; this pass keeps only what it reaches.
    """
    real_root = os.path.realpath(root)

    def first_listed(real: str) -> str | None:
        return _listed_by_pass_1(root, real_root, real, unlisted)

    listed: dict[str, str] = {}  # real path -> the link path it was listed under
    walked: dict[str, str] = {}  # real folder -> the link it was walked through
    while links:
        nested: list[str] = []
        for link in sorted(links):
            if not os.path.isdir(link):  # a file link, broken, or a loop of file links
                yield link, _alias(link, listed, first_listed)
                continue
            real = os.path.realpath(link)
            parent = os.path.realpath(os.path.dirname(link))
            if parent == real or parent.startswith(real + "/"):
                yield link, ("unreadable", "symlink loop: a link to its own parent folder")
                continue
            if real in walked:
                yield link, ("duplicate_file", f"links to the folder of {walked[real]}")
                continue
            walked[real] = link
            for dirpath, dirnames, filenames in os.walk(link):
                names = _visible(dirnames)
                for d in names:
                    if os.path.islink(os.path.join(dirpath, d)):
                        nested.append(os.path.join(dirpath, d))
                dirnames[:] = [d for d in names if not os.path.islink(os.path.join(dirpath, d))]
                for name in _visible(filenames):
                    path = os.path.join(dirpath, name)
                    yield path, _alias(path, listed, first_listed)
        links = nested


def _listed_by_pass_1(root: str, real_root: str, real: str, unlisted: frozenset) -> str | None:
    """The path pass 1 listed a real path under, or None if it did not list it.

    Pass 1 lists every visible entry that is not a folder, reached from the
    root through visible real folders it could list. So a real path was
    listed exactly when it lies under the root's real path, no part of it is
    hidden or a symlink (only a loop leaves one in), no folder above it is in
    ``unlisted``, and it exists and is not a folder.
    """
    rel = paths.relative_to(real_root, real)
    if rel is None:
        return None
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return None
    if any("/".join(parts[:i]) in unlisted for i in range(1, len(parts))):
        return None
    if not os.path.lexists(real) or os.path.isdir(real):
        return None
    # a symlink loop has no real path: realpath leaves links in it
    if any(os.path.islink(f"{real_root}/{'/'.join(parts[:i])}") for i in range(1, len(parts) + 1)):
        return None
    return f"{root}/{rel}"


def _real_files(root: str, links: list[str], prefix: str = "", recurse: bool = True):
    """Pass 1: (path, path relative to root, None) of every file under root that
    is not a symlink, without following symlinks (each is appended to
    ``links``); (folder, its relative path, the error) for a sub-folder that
    cannot be listed (``os.walk`` would skip it, and its files with it).

    Top-down like ``os.walk`` (a folder's files sorted, then its sub-folders
    sorted), hidden names skipped; ``os.scandir`` tells links and folders
    apart without a stat a file. The root itself must list: its error raises.
    ``prefix``: root's own path relative to the walk's root; ``recurse``
    False: root's own entries only, sub-folders not entered.
    """
    stack = [(root, prefix)]
    while stack:
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=_name)
        except OSError as e:
            if not rel:  # the input folder itself
                raise
            yield folder, rel, f"{type(e).__name__}: {e.strerror or e}"
            continue
        folders = []
        for e in entries:
            if e.is_symlink():
                links.append(e.path)
            elif _is_folder(e):
                if recurse:
                    folders.append((e.path, f"{rel}/{e.name}" if rel else e.name))
            else:
                yield e.path, f"{rel}/{e.name}" if rel else e.name, None
        stack.extend(reversed(folders))


def _name(entry) -> str:
    return entry.name


def _is_folder(entry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _alias(path: str, listed: dict[str, str], first_listed) -> tuple[str, str] | None:
    """None for a file seen for the first time (now listed); else why it is a reject.

    ``first_listed(real)``: where pass 1 listed a real path, or None.
    """
    real = os.path.realpath(path)
    seen = first_listed(real) or listed.get(real)
    if seen:
        return "duplicate_file", f"the same file as {seen} (through a symlink)"
    listed[real] = path
    return None


# Inputs a listed element: Beam's cost per element between steps (encode, count,
# filter, key for the Reshuffle: ~40 us) was most of a serial listing's time.
CHUNK = 256


def chunked(items, size: int = CHUNK):
    """Lists of up to ``size`` consecutive items."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _reject(key: str, source: str, reason: str, detail: str) -> Reject:
    Metrics.counter("evenshard", f"rejected_{reason}").inc()
    return make_reject(key, source, reason, detail)


class _ReadManifest(beam.DoFn):
    """manifest path -> Candidate per row, and rejects for unusable rows.

    Relative paths resolve against the manifest's folder and may not leave it;
    absolute paths and URLs are used as given. Blank lines are not inputs.
    """

    def __init__(self, job: Job):
        self._root = job.input_root
        self._kind = job.options.record_kind
        self._path_root = job.path_root
        self._group_by = job.options.group_by
        self._vocabulary = frozenset(job.vocabulary) if job.vocabulary else None
        self._rows = Metrics.counter("evenshard", "manifest_rows")

    def process(self, manifest: str):
        yield from chunked(self._listing(manifest))

    def _listing(self, manifest: str):
        progress = Progress("list", "rows")
        with _open_text(manifest, errors="surrogateescape") as f:
            for row_number, row in self._rows_of(manifest, f):
                self._rows.inc()
                progress.add()
                yield self._candidate(self._root, self._path_root, row_number, row)

    @staticmethod
    def _rows_of(manifest: str, f):
        """Yields (row number, dict or error text); blank lines are skipped."""
        if is_csv(manifest):
            reader = csv.reader(f)
            header = [c.strip() for c in next(reader, [])]
            while True:
                try:
                    values = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:  # a field over 16 MiB: this row only
                    yield reader.line_num, f"row cannot be parsed as CSV: {e}"
                    continue
                if not any(v.strip() for v in values):
                    continue
                if len(values) != len(header):
                    yield (
                        reader.line_num,
                        (f"row has {len(values)} fields, the header has {len(header)}"),
                    )
                else:
                    yield reader.line_num, {k: v for k, v in zip(header, values) if k}
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
                yield number, {k: _text(v) for k, v in row.items()}

    def _candidate(self, root: str, path_root: str, number: int, row):
        row_key = f"row:{number}"
        if isinstance(row, str):
            return _reject(row_key, f"row {number}", "malformed_row", row)
        path = row.get("path", "").strip()
        if not path:
            return _reject(row_key, f"row {number}", "malformed_row", "path is empty or missing")
        for name in ("path", "key", "split", self._group_by):
            if isinstance(row.get(name), _NotText):
                detail = f"{name} {row[name]} is not a string or a whole number"
                return _reject(row_key, f"row {number}", "malformed_row", detail)
        key = row.get("key", "").strip() or paths.normalize_key(path)
        try:
            paths.check_text(key)
        except paths.BadPath as e:
            return _reject(row_key, f"row {number}", "bad_path", f"key: {e}")
        try:
            source = paths.resolve(root, path)
        except paths.BadPath as e:
            return _reject(key, path, "bad_path", str(e))
        label = row.get("label", "")
        problem = _bad_label(label, self._vocabulary)
        if problem:
            return _reject(key, source, "bad_label", problem)
        split = row.get("split", "").strip() or None
        if split is not None and not SPLIT_NAME_RE.match(split):
            return _reject(
                key,
                source,
                "bad_split",
                f"split {split[:40]!r} is not a valid name (letters, digits, '_'; at most "
                f"{MAX_SPLIT_NAME})",
            )
        rel_path = ""
        if self._kind == "path":
            rel_path = paths.relative_to(path_root, source)
            if rel_path is None:
                return _reject(key, source, "bad_path", f"not under --path_root {path_root}")
        group = None
        if self._group_by:  # an empty group value: the row is a group of its own (its key)
            group = row.get(self._group_by, "").strip() or None
        return Candidate(
            key, paths.compact_source(root, source, key), rel_path, label, split, group, number
        )


class _KeepFirst(beam.DoFn):
    """(key, [Candidate]) -> the lowest-row Candidate; the others are ``reason`` rejects.

    Grouped by ``key``: the same key on two rows (``duplicate_key``), or the
    same file under two spellings (``duplicate_file``, keyed by
    ``file_identity``).
    """

    def __init__(self, root: str, reason: str):
        self._root, self._reason = root, reason

    def process(self, element):
        _, candidates = element
        first, *others = sorted(candidates, key=lambda c: (c.row, c.key, c.source))
        yield first
        for c in others:
            if self._reason == "duplicate_key":
                detail = f"row {c.row}: key also at row {first.row}"
            else:
                detail = f"row {c.row}: the same file as row {first.row} (key {first.key})"
            source = paths.full_source(self._root, c.source, c.key)
            yield _reject(c.key, source, self._reason, detail)


class _OneSplitPerGroup(beam.DoFn):
    """(group, [Candidate]) -> the group's Candidates, all with the split its rows give.

    A group never spans two splits: rows without a ``split`` value follow the
    group's rows that have one; rows that give two different splits are a
    contradiction, and every row of the group is a ``bad_split`` reject (no
    part of it is written to either split).
    """

    def __init__(self, root: str):
        self._root = root

    def process(self, element):
        group, candidates = element
        given = sorted({c.split for c in candidates if c.split is not None})
        if len(given) > 1:
            detail = f"group {group!r} is given splits {', '.join(given)} by different rows"
            for c in candidates:
                source = paths.full_source(self._root, c.source, c.key)
                yield _reject(c.key, source, "bad_split", detail)
            return
        split = given[0] if given else None
        for c in candidates:
            yield c._replace(split=split)


def file_identity(root: str, candidate: Candidate) -> str:
    """What a manifest row's file is: its real path (symlinks and ``..`` resolved),
    as the folder walk knows files; a URL as written (normalized)."""
    source = paths.full_source(root, candidate.source, candidate.key)
    return source if paths.is_url(source) else os.path.realpath(source)


def _items(chunk):
    return chunk


def _is_chunk(element) -> bool:
    return isinstance(element, list)


def _is_links(element) -> bool:
    return isinstance(element, _Links)


class _ListFolder(beam.PTransform):
    """PBegin -> chunks of Candidate | Reject: the label folders walked in parallel,
    then the symlinks they hold followed in one place."""

    def __init__(self, job: Job):
        super().__init__()
        self._job = job

    def expand(self, pbegin):
        lister = _ListImageFolder(self._job)
        walked = (
            pbegin
            | "Start" >> beam.Create([self._job.input_root])
            | "Folders" >> beam.FlatMap(listing_work)
            | "SpreadFolders" >> beam.Reshuffle()
            | "Walk" >> beam.ParDo(lister)
        )
        followed = (
            walked
            | "Links" >> beam.Filter(_is_links)
            | "AllLinks" >> beam.combiners.ToList()
            | "FollowLinks" >> beam.FlatMap(lister.follow)
        )
        files = walked | "Files" >> beam.Filter(_is_chunk)
        return (files, followed) | "AllListed" >> beam.Flatten()


class ReadInputs(beam.PTransform):
    """PBegin -> {main: Candidate, rejects: Reject, inputs: count of all inputs}."""

    def __init__(self, job: Job):
        super().__init__()
        self._job = job

    def expand(self, pbegin):
        o = self._job.options
        # -> [Candidate | Reject], in chunks (CHUNK)
        if o.is_manifest:
            chunks = (
                pbegin
                | "Start" >> beam.Create([o.input])
                | "List" >> beam.ParDo(_ReadManifest(self._job))
            )
        else:
            chunks = pbegin | "ListFolder" >> _ListFolder(self._job)
        inputs = (
            chunks
            | "ChunkSize" >> beam.Map(len)
            | "CountInputs" >> beam.CombineGlobally(sum)  # 0 for an empty listing
        )
        if not o.is_manifest:
            # Paths under one root are unique keys already: no dedupe, just spread.
            chunks = chunks | "Spread" >> beam.Reshuffle()
        listed = chunks | "Unchunk" >> beam.FlatMap(_items) | "SplitListing" >> SplitRejects()
        if o.is_manifest:
            # key -> [Candidate] -> the first; the GroupByKey also spreads the
            # listing's single bundle over workers. Then the same for the file
            # itself: one file under two spellings is one input, not two.
            root = self._job.input_root
            unique = (
                listed["main"]
                | "KeyByKey" >> beam.Map(lambda c: (c.key, c))
                | "GroupByKey" >> beam.GroupByKey()
                | "KeepFirstOfKey" >> beam.ParDo(_KeepFirst(root, "duplicate_key"))
                | "SplitDuplicates" >> SplitRejects()
            )
            files = (
                unique["main"]
                | "KeyByFile" >> beam.Map(lambda c: (file_identity(root, c), c))
                | "GroupByFile" >> beam.GroupByKey()
                | "KeepFirstOfFile" >> beam.ParDo(_KeepFirst(root, "duplicate_file"))
                | "SplitSameFiles" >> SplitRejects()
            )
            candidates = files["main"]
            rejects = [listed["rejects"], unique["rejects"], files["rejects"]]
            if o.group_by:
                # group -> [Candidate] -> one split a group (rows without a group value
                # are groups of their own: they pass by)
                grouped = (
                    candidates
                    | "InAGroup" >> beam.Filter(lambda c: c.group is not None)
                    | "KeyByGroup" >> beam.Map(lambda c: (c.group, c))
                    | "GroupByGroup" >> beam.GroupByKey()
                    | "OneSplitPerGroup" >> beam.ParDo(_OneSplitPerGroup(root))
                    | "SplitGroupRejects" >> SplitRejects()
                )
                alone = candidates | "NoGroup" >> beam.Filter(lambda c: c.group is None)
                candidates = (grouped["main"], alone) | "AllGrouped" >> beam.Flatten()
                rejects.append(grouped["rejects"])
            rejects = tuple(rejects) | "ListingRejects" >> beam.Flatten()
        else:
            candidates, rejects = listed["main"], listed["rejects"]
        return {"main": candidates, "rejects": rejects, "inputs": inputs}
