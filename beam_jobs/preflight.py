"""Pre-flight: what the driver checks and reads once, before any pipeline is built.

``preflight`` completes the frozen :class:`Job` whose paths ``Job.of``
resolved: the input checked to exist (a manifest's header too), and a
``--labels`` vocabulary read. A mistake stops here, in the driver, as a
:class:`UserError` naming the flag. Beam's FileSystems reads
URLs; no pipeline is involved.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os

from apache_beam.io.filesystems import FileSystems

from beam_jobs.candidates import manifest_columns
from beam_jobs.filesystems import open_text
from beam_jobs.job import Job
from beam_jobs.record_rules import RecordFeatures, choose_features, is_glob, record_input_formats
from convert_core import paths
from convert_core.options import EXAMPLE_KIND, ConvertOptions, UserError, is_csv

log = logging.getLogger(__name__)

# The files preflight looks at for a first record, or for images in a bucket's folder:
# a listing's first page.
_FIRST_FILES = 1000


def preflight(job: Job, offline: bool = False) -> Job:
    """Checks the inputs ``job`` names and reads its vocabulary, once: the Job complete.

    Args:
        job: the Job of the options, its paths resolved (``Job.of``).
        offline: a dry run: checks that would reach a cloud store (an input
            or ``--labels`` file at a URL) are skipped, with one log line.

    Raises:
        UserError: a missing input, a manifest without the needed columns, a
            bad ``--labels`` file.
    """
    options = job.options
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
        features, class_names = check_records(job)
    else:
        check_input(options, job.input_root, job.manifest)
    vocabulary = None
    if options.labels_file and offline and paths.is_url(options.labels_file):
        skipped.append("--labels (the job is translated without a fixed vocabulary)")
    elif options.labels_file:
        vocabulary = tuple(load_vocabulary(options.labels_file))
    elif class_names and features.label_kind == "int64":
        vocabulary = class_names  # an int label is a position in them, as in --labels
    if skipped:
        log.warning("evenshard: dry run, cloud checks skipped: %s", "; ".join(skipped))
    return dataclasses.replace(job, vocabulary=vocabulary, features=features)


def check_input(options: ConvertOptions, root: str, manifest: str | None) -> list[str]:
    """Checks the input exists (and a manifest's header) in the driver: the image folder
    ``root``, or ``manifest`` (both resolved; messages name ``--input`` as typed).

    Returns:
        The manifest's column names ([] for an image folder).

    Raises:
        UserError: missing folder or manifest, or a manifest without the
            required columns.
    """
    _check_scheme(options.input)
    if manifest is None:
        if paths.is_url(root):
            listed = FileSystems.match([root + "/**"], limits=[_FIRST_FILES])[0].metadata_list
            if not listed:
                raise UserError(f"--input: no files under {root}")
            _check_not_records(options.input, [paths.relative_to(root, m.path) for m in listed])
        elif os.path.exists(root) and not os.path.isdir(root):
            raise UserError(
                f"--input: {options.input!r} is a file, not a folder; give an image folder, "
                "or a manifest ending .csv, .jsonl, .csv.gz or .jsonl.gz"
            )
        elif not os.path.isdir(root):
            raise UserError(f"--input: folder {options.input!r} does not exist")
        else:
            files = next((f for _, _, f in os.walk(root, followlinks=True) if f), [])
            if not files:
                raise UserError(f"--input: folder {options.input!r} holds no files")
            _check_not_records(options.input, files)
        return []
    if not paths.is_url(manifest) and os.path.isdir(manifest):
        raise UserError(
            f"--input: {options.input!r} is a folder, not a manifest file; "
            "give the folder without a manifest suffix, or a .csv/.jsonl file"
        )
    if not FileSystems.exists(manifest):
        raise UserError(f"--input: manifest {options.input!r} does not exist")
    try:
        with open_text(manifest, errors="surrogateescape") as f:
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


def _check_not_records(given: str, names: list[str]) -> None:
    """An image folder's first files (``names``, relative to it) are not all record
    files: those are read with ``--input_format`` alone, else each is an
    ``unsupported_format`` reject.

    Raises:
        UserError: record files and no image, naming one and the --input_format to add.
    """
    from beam_jobs.record_formats import record_format

    found = record_input_formats(names)
    if not found:
        return
    held = " and ".join(f"{record_format(f).what} files ({files[0]})" for f, files in found.items())
    flags = " or ".join(f"--input_format={f}" for f in found)
    raise UserError(f"--input: folder {given!r} holds {held}, no images: add {flags}")


def _check_scheme(url: str) -> None:
    if paths.is_url(url):
        try:
            FileSystems.get_filesystem(url)
        except ValueError:
            scheme = url.split("://", 1)[0]
            raise UserError(
                f"--input {url}: {scheme}:// is not a file system Beam reads; give a "
                "local path or a gs:// URL (s3:// with apache-beam[aws])"
            ) from None


def check_records(job: Job) -> tuple[RecordFeatures, tuple[str, ...] | None]:
    """The record files of ``--input_format`` (tfrecord, parquet, webdataset, tfds) exist,
    and the features of their first readable record are chosen
    (``record_rules.choose_features``). Reads one listing page and one record, whatever
    the number of files.

    Returns:
        The features, and the label's class names the file declares (ClassLabel
        names: Parquet's metadata, TFDS's ``LABEL.labels.txt``), or None.

    Raises:
        UserError: no files, no readable record, or features that do not fit.
    """
    from beam_jobs.record_formats import record_format
    from beam_jobs.record_source import record_files

    options = job.options
    fmt = record_format(options.input_format)
    _check_scheme(options.input)
    image, label = options.image_feature, options.label_feature
    if options.input_format == "tfds":  # features.json gives the defaults
        from beam_jobs import tfds_source

        image_default, label_default = tfds_source.check(job.input_root, options.input_split)
        image, label = image or image_default, label or label_default
    named_only = not is_glob(options.input)
    try:
        files = record_files(fmt, job.records, job.input_root, named_only, _FIRST_FILES)
    except OSError:  # BeamIOError: nothing there
        files = []
    if not files and is_glob(options.input):
        raise UserError(f"--input: no files match {options.input!r}")
    if not files:
        raise UserError(
            f"--input: no {fmt.what} files (named {fmt.files}) under {options.input!r}; for "
            "files named otherwise give a glob of them"
        )
    problem = ""
    for path in files:
        try:
            found = fmt.first(path)
        except (OSError, ValueError) as e:  # CorruptRecord is a ValueError
            problem = problem or (f" ({e})" if path in str(e) else f" ({path}: {e})")
            continue
        if found is not None:
            features = _features(options, found, image, label, fmt.label_names)
            return features, fmt.class_names(path, features.label) if features.label else None
    readable = "tf.train.Example" if fmt.what == "TFRecord" else "row"
    raise UserError(
        f"--input: none of the first {len(files)} {fmt.what} files of {options.input!r} holds "
        f"a readable {readable}{problem}"
    )


def _features(options: ConvertOptions, found: dict, image, label, label_names) -> RecordFeatures:
    """The features of a first record ``found``: ``--record_kind example``'s
    (``pass_through``: the named ones only), else ``choose_features``', with the
    ``--group_by`` feature."""
    from beam_jobs.pass_through import choose_example_features

    group, key = options.group_by, options.key_feature
    if options.record_kind == EXAMPLE_KIND:
        return choose_example_features(found, options.label_feature, key, group)
    features = choose_features(found, image, label, key, label_names)
    if group:  # checked as the example kind checks it
        choose_example_features(found, None, None, group)
    return dataclasses.replace(features, group=group)


def load_vocabulary(path: str) -> list[str]:
    """Reads a ``--labels`` file: one label a line; blank lines ignored."""
    if not paths.is_url(path) and os.path.isdir(path):
        raise UserError(f"--labels: {path!r} is a folder; give a file with one label a line")
    if not FileSystems.exists(path):
        raise UserError(f"--labels: file {path!r} does not exist")
    try:
        with open_text(path) as f:
            labels = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise UserError(f"--labels: file {path!r} is not UTF-8 text ({e.reason})") from None
    if not labels:
        raise UserError(f"--labels: file {path!r} holds no labels")
    if len(set(labels)) != len(labels):
        raise UserError(f"--labels: file {path!r} lists a label twice")
    return labels
