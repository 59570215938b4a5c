"""Pre-flight of a record input (``--input_format`` tfrecord, parquet, webdataset,
tfds): its files exist and the features of its first readable record are chosen, in
the driver. The core's ``preflight`` asks it through ``RECORDS``; the formats' reading
is Beam's (their source modules' DoFns), so this stays beside them."""

from __future__ import annotations

import dataclasses

from convert_core.job import Job
from convert_core.options import EXAMPLE_KIND, ConvertOptions, UserError
from convert_core.preflight import FIRST_FILES
from convert_core.record_rules import RecordFeatures, choose_features, is_glob


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
    image, label = options.image_feature, options.label_feature
    if fmt.feature_defaults is not None:  # a dataset's own description gives them (TFDS)
        image_default, label_default = fmt.feature_defaults(job.input_root, options.input_split)
        image, label = image or image_default, label or label_default
    named_only = not is_glob(options.input)
    try:
        files = record_files(fmt, job.records, job.input_root, named_only, FIRST_FILES)
    except OSError:  # nothing there
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


class _RecordInputs:
    """The record formats as the core's ``preflight`` asks them (``RecordInputs``)."""

    def check(self, job: Job) -> tuple[RecordFeatures, tuple[str, ...] | None]:
        return check_records(job)

    def what(self, input_format: str) -> str:
        from beam_jobs.record_formats import record_format

        return record_format(input_format).what


RECORDS = _RecordInputs()
