"""The Job: one conversion, resolved once in the driver.

``Job.of`` resolves every path of the options once (the input root, the
output folder and the files convert keeps in it, the manifest, the path
root, the ``--labels`` file's folder); ``preflight`` checks the inputs and
adds the vocabulary. The steps take the values they use from it, as they are.
"""

from __future__ import annotations

import dataclasses

from convert_core import paths
from convert_core.candidates import CandidateRules
from convert_core.options import RECORD_FORMATS, ConvertOptions
from convert_core.record_rules import RecordFeatures, glob_root, is_glob
from schemas.layout import FORMAT_VERSION, INCOMPLETE_DIR, REJECTS_FILE, join


@dataclasses.dataclass(frozen=True)
class Job:
    """One conversion, resolved once in the driver: all the steps need.

    The flags in ``options`` keep the paths as typed (for messages, and for
    ``dataset_info.json``'s ``input``); the paths here are resolved (absolute,
    normalized, no trailing slash) and used as they are.

    Attributes:
        options: the validated flags.
        input_root: the folder keys and relative sources are measured from
            (the image folder, or the manifest's folder).
        output_dir: the output folder.
        rejects_file: ``rejects/rejects.jsonl`` in it.
        incomplete_dir: its ``.incomplete/`` folder (temp shards, the records of
            the shards renamed into place, a refusal).
        manifest: the manifest read, or None for an image folder.
        path_root: path kind: the root stored paths are relative to; else None.
        labels_folder: the folder of the ``--labels`` file, or None.
        splits: the split names and their fractions, in the order of ``--splits``.
        settings: what dataset_info.json records of how the dataset was made: the flags
            that shape it (``input`` as typed) and, for path records, the path root.
        vocabulary: the ``--labels`` vocabulary in order, or None.
        records: a record input (``--input_format`` tfrecord, parquet, webdataset,
            tfds): the glob of its files (a folder's: ``ROOT/**``, the files its format
            names; tfds: the version folder's shards of ``--input_split``); else None.
        features: the records' image, label and key features (``preflight``).
        rules: the rules each listed input is made a candidate by (its key, label,
            group and path; ``preflight``, which knows the vocabulary).
    """

    options: ConvertOptions
    input_root: str
    output_dir: str
    rejects_file: str
    incomplete_dir: str
    manifest: str | None
    path_root: str | None
    labels_folder: str | None
    splits: tuple[tuple[str, ...], tuple[float, ...]]
    settings: dict = dataclasses.field(hash=False)
    vocabulary: tuple[str, ...] | None = None
    records: str | None = None
    features: RecordFeatures | None = None
    rules: CandidateRules | None = None

    @classmethod
    def of(cls, options: ConvertOptions) -> Job:
        """The Job of ``options``, every path resolved (``paths.normalize_root``); nothing
        is read: ``preflight`` checks the inputs and adds the vocabulary."""
        settings = _settings(options)
        splits = (options.split_names, options.split_fractions)
        records = None
        if options.is_manifest:
            manifest = paths.normalize_root(options.input)
            root = paths.normalize_root(paths.posix_dirname(options.input))
        elif split_files := _split_files(options.input_format):  # a split's files (TFDS)
            manifest, root = None, paths.normalize_root(options.input)
            records = split_files.format(root=root, split=options.input_split or "*")
        elif options.input_format != "images":
            manifest, root = None, paths.normalize_root(glob_root(options.input))
            glob = is_glob(options.input)
            records = paths.normalize_root(options.input) if glob else root + "/**"
        else:
            manifest, root = None, paths.normalize_root(options.input)
        path_root = None
        if options.record_kind == "path":
            path_root = paths.normalize_root(options.path_root) if options.path_root else root
            settings["path_root"] = path_root
        labels = options.labels_file
        out = paths.normalize_root(options.output_dir)
        return cls(
            options,
            input_root=root,
            output_dir=out,
            rejects_file=join(out, REJECTS_FILE),
            incomplete_dir=join(out, INCOMPLETE_DIR),
            manifest=manifest,
            path_root=path_root,
            labels_folder=paths.normalize_root(paths.posix_dirname(labels)) if labels else None,
            splits=splits,
            settings=settings,
            records=records,
        )


def _settings(options: ConvertOptions) -> dict:
    """The flags dataset_info.json records (``Job.settings``)."""
    recorded = {
        "format_version": FORMAT_VERSION,
        "record_kind": options.record_kind,
        "seed": options.seed,
        "balance": options.balance,
        "compression": options.compression,
        "verify": options.verify,
        "dedupe": options.dedupe,
        "input": options.input,
        "split_options": {
            "splits": dict(options.splits),
            "split_mode": options.split_mode,
            "split_seed": options.split_seed,
            "group_by": options.group_by,
        },
        "shard_options": {
            "target_shard_mb": options.target_shard_mb,
            "num_shards": options.num_shards,
            "examples_per_shard": options.examples_per_shard,
            "shard_multiple": options.shard_multiple,
        },
    }
    if options.record_kind == "example":  # the features a reader takes the label, key from
        recorded["label_feature"] = options.label_feature
        recorded["key_feature"] = options.key_feature
    return recorded


def _split_files(input_format: str) -> str | None:
    """The registry's pattern of one split's files for a format whose input is a
    dataset's folder of splits (TFDS's version folder), else None."""
    row = RECORD_FORMATS.get(input_format)
    return row.split_files if row else None
