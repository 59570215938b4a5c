"""Pre-flight: what the driver checks and reads once, before any pipeline is built.

``preflight`` completes the frozen :class:`Job` whose paths ``Job.of``
resolved: the input checked to exist (a manifest's header too), a
``--labels`` vocabulary read, the output folder checked to hold no input. A
mistake stops here, in the driver, as a :class:`UserError` naming the flag.
Files are read through ``schemas.storage``, a record input's first record
through the ``records`` given (``beam_jobs.record_preflight``); no pipeline is
involved.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
from typing import Protocol

from convert_core import paths
from convert_core.candidates import CandidateRules, manifest_columns
from convert_core.job import Job
from convert_core.options import ConvertOptions, UserError, is_csv
from convert_core.record_rules import RecordFeatures, record_input_formats
from schemas import storage

log = logging.getLogger(__name__)

# The files preflight looks at for a first record, or for images in a bucket's folder:
# a listing's first page.
FIRST_FILES = 1000


class RecordInputs(Protocol):
    """What preflight asks of the record formats (``beam_jobs.record_preflight``)."""

    def check(self, job: Job) -> tuple[RecordFeatures, tuple[str, ...] | None]:
        """A record input's files exist; the features of its first readable record, and
        the label's class names its files declare (or None)."""
        ...

    def what(self, input_format: str) -> str:
        """The format's name in messages (``TFRecord``)."""
        ...


class NoRecordInputs:
    """No record format (the in-process writer's): a record input is a ``UserError``."""

    def check(self, job: Job) -> tuple[RecordFeatures, tuple[str, ...] | None]:
        raise UserError(f"--input_format={job.options.input_format}: read by beam_jobs only")

    def what(self, input_format: str) -> str:
        return input_format


def preflight(job: Job, records: RecordInputs | None = None, offline: bool = False) -> Job:
    """Checks the inputs ``job`` names and reads its vocabulary, once: the Job complete.

    Args:
        job: the Job of the options, its paths resolved (``Job.of``).
        records: the record formats' checks (None: no record input is read).
        offline: a dry run: checks that would reach a cloud store (an input
            or ``--labels`` file at a URL) are skipped, with one log line.

    Raises:
        UserError: a missing input, a manifest without the needed columns, a
            bad ``--labels`` file, an output folder that holds an input.
    """
    options = job.options
    for flag, url in (("--input", options.input), ("--output_dir", options.output_dir)):
        check_scheme(flag, url)
    if options.labels_file:
        check_scheme("--labels", options.labels_file)
    skipped = []
    features = class_names = None
    if offline and paths.is_url(options.input):
        skipped.append("--input exists and its columns (or its records' features)")
        if job.records:
            o = options
            features = RecordFeatures(
                o.image_feature, o.label_feature, "int64", o.key_feature, o.group_by
            )
    elif job.records:
        features, class_names = (records or NoRecordInputs()).check(job)
    else:
        check_input(options, job.input_root, job.manifest, records or NoRecordInputs())
    vocabulary = None
    if options.labels_file and offline and paths.is_url(options.labels_file):
        skipped.append("--labels (the job is translated without a fixed vocabulary)")
    elif options.labels_file:
        vocabulary = tuple(load_vocabulary(options.labels_file))
    elif class_names and features.label_kind == "int64":
        vocabulary = class_names  # an int label is a position in them, as in --labels
    if skipped:
        log.warning("evenshard: dry run, cloud checks skipped: %s", "; ".join(skipped))
    check_not_an_input(job)
    rules = CandidateRules(
        root=job.input_root,
        path_root=job.path_root,
        kind=options.record_kind,
        vocabulary=frozenset(vocabulary) if vocabulary else None,
        group_by=options.group_by,
    )
    return dataclasses.replace(job, vocabulary=vocabulary, features=features, rules=rules)


def _real(path: str) -> str:
    return path if paths.is_url(path) else os.path.realpath(path)


def _inside(folder: str, path: str) -> bool:
    return folder == path or paths.relative_to(folder, path) is not None


def check_not_an_input(job: Job) -> None:
    """Refuses an output folder that holds, or lies inside, the job's inputs: the input
    folder and the real folders its symlinked label folders lead to, the
    manifest's folder, and any folder holding the ``--labels`` file."""
    o = job.options
    out = _real(job.output_dir)
    if job.manifest is None:
        for folder, via in _input_folders(job.input_root):
            if _inside(folder, out):
                raise UserError(
                    f"--output_dir {o.output_dir} lies inside the input folder "
                    f"{job.input_root}{via}; choose a folder outside it"
                )
    elif _real(job.input_root) == out:
        raise UserError(
            f"--output_dir {o.output_dir} holds the --input file {o.input}; choose another "
            "folder (convert writes labels.txt, schema.pbtxt and rejects/ there)"
        )
    if job.labels_folder and _inside(out, _real(job.labels_folder)):
        raise UserError(
            f"--output_dir {o.output_dir} holds the --labels file {o.labels_file}; choose "
            "another folder (convert writes labels.txt, schema.pbtxt and rejects/ there)"
        )


def _input_folders(root: str) -> list[tuple[str, str]]:
    """(real path, how it is reached) of the input folder and of the folders its
    top-level symlinks lead to (label folders that live elsewhere)."""
    folders = [(_real(root), "")]
    if paths.is_url(root):
        return folders
    try:
        with os.scandir(root) as it:
            for e in it:
                if e.is_symlink() and os.path.isdir(e.path):
                    real = os.path.realpath(e.path)
                    folders.append((real, f" (its label folder {e.name} is a link to {real})"))
    except OSError:
        pass  # preflight reports an input folder it cannot list
    return folders


def check_input(
    options: ConvertOptions, root: str, manifest: str | None, records: RecordInputs
) -> list[str]:
    """Checks the input exists (and a manifest's header) in the driver: the image folder
    ``root``, or ``manifest`` (both resolved; messages name ``--input`` as typed); a
    folder of record files names their format (``records``).

    Returns:
        The manifest's column names ([] for an image folder).

    Raises:
        UserError: missing folder or manifest, or a manifest without the
            required columns.
    """
    if manifest is None:
        if paths.is_url(root):
            listed = storage.match("**", FIRST_FILES, folder=root)
            if not listed:
                raise UserError(f"--input: no files under {root}")
            names = [paths.relative_to(root, path) for path, _ in listed]
            _check_not_records(options.input, names, records)
        elif os.path.exists(root) and not os.path.isdir(root):
            raise UserError(
                f"--input: {options.input!r} is a file, not a folder; give an image folder, "
                "or a manifest ending .csv, .jsonl, .csv.gz or .jsonl.gz"
            )
        elif not os.path.isdir(root):
            raise UserError(f"--input: folder {options.input!r} does not exist")
        else:
            found = next((f for _, _, f in os.walk(root, followlinks=True) if f), [])
            if not found:
                raise UserError(f"--input: folder {options.input!r} holds no files")
            _check_not_records(options.input, found, records)
        return []
    if not paths.is_url(manifest) and os.path.isdir(manifest):
        raise UserError(
            f"--input: {options.input!r} is a folder, not a manifest file; "
            "give the folder without a manifest suffix, or a .csv/.jsonl file"
        )
    if not storage.exists(manifest):
        raise UserError(f"--input: manifest {options.input!r} does not exist")
    try:
        with storage.open_text(manifest, errors="surrogateescape") as f:
            columns, has_rows = manifest_columns(manifest, f)
    except (UnicodeDecodeError, OSError, EOFError, csv.Error) as e:
        raise UserError(f"--input: manifest {options.input} cannot be read: {e}") from None
    if not has_rows:
        raise UserError(f"--input: manifest {options.input} lists no inputs")
    if not is_csv(manifest):
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


def _check_not_records(given: str, names: list[str], records: RecordInputs) -> None:
    """An image folder's first files (``names``, relative to it) are not all record
    files: those are read with ``--input_format`` alone, else each is an
    ``unsupported_format`` reject.

    Raises:
        UserError: record files and no image, naming one and the --input_format to add.
    """
    found = record_input_formats(names)
    if not found:
        return
    held = " and ".join(f"{records.what(f)} files ({files[0]})" for f, files in found.items())
    flags = " or ".join(f"--input_format={f}" for f in found)
    raise UserError(f"--input: folder {given!r} holds {held}, no images: add {flags}")


def check_scheme(flag: str, url: str) -> None:
    """``url`` is a local path, or a URL of a store convert reads and writes (gs://, s3://)."""
    if paths.is_url(url) and storage.store_of(url) is None:
        scheme = url.split("://", 1)[0]
        raise UserError(
            f"{flag} {url}: convert reads and writes local paths, gs:// and s3:// URLs, "
            f"not {scheme}://"
        )


def load_vocabulary(path: str) -> list[str]:
    """Reads a ``--labels`` file: one label a line; blank lines ignored."""
    if not paths.is_url(path) and os.path.isdir(path):
        raise UserError(f"--labels: {path!r} is a folder; give a file with one label a line")
    if not storage.exists(path):
        raise UserError(f"--labels: file {path!r} does not exist")
    try:
        with storage.open_text(path) as f:
            labels = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise UserError(f"--labels: file {path!r} is not UTF-8 text ({e.reason})") from None
    if not labels:
        raise UserError(f"--labels: file {path!r} holds no labels")
    if len(set(labels)) != len(labels):
        raise UserError(f"--labels: file {path!r} lists a label twice")
    return labels
