"""The Job: one conversion, resolved once in the driver.

``Job.of`` resolves every path of the options once (the input root, the
output folder and the files convert keeps in it, the manifest, the path
root, the ``--labels`` file's folder); ``preflight`` checks the inputs and
adds the vocabulary. The steps take the values they use from it, as they are.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

from beam_jobs.candidates import CandidateRules
from beam_jobs.record_rules import RecordFeatures, glob_root, is_glob
from convert_core import paths
from convert_core.options import ConvertOptions, is_csv
from schemas.layout import INCOMPLETE_DIR, REJECTS_FILE, join


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
        vocabulary: the ``--labels`` vocabulary in order, or None.
        records: a record input (``--input_format`` tfrecord, parquet, webdataset,
            tfds): the glob of its files (a folder's: ``ROOT/**``, the files its format
            names; tfds: the version folder's shards of ``--input_split``); else None.
        features: the records' image, label and key features (``preflight``).
    """

    options: ConvertOptions
    input_root: str
    output_dir: str
    rejects_file: str
    incomplete_dir: str
    manifest: str | None
    path_root: str | None
    labels_folder: str | None
    vocabulary: tuple[str, ...] | None = None
    records: str | None = None
    features: RecordFeatures | None = None

    @classmethod
    def of(cls, options: ConvertOptions) -> Job:
        """The Job of ``options``, every path resolved (``paths.normalize_root``); nothing
        is read: ``preflight`` checks the inputs and adds the vocabulary."""
        records = None
        if options.is_manifest:
            manifest = paths.normalize_root(options.input)
            root = paths.normalize_root(paths.posix_dirname(options.input))
        elif options.input_format == "tfds":  # the version folder's shards (of a split)
            manifest, root = None, paths.normalize_root(options.input)
            records = f"{root}/*-{options.input_split or '*'}.tfrecord-*-of-*"
        elif options.input_format != "images":
            manifest, root = None, paths.normalize_root(glob_root(options.input))
            glob = is_glob(options.input)
            records = paths.normalize_root(options.input) if glob else root + "/**"
        else:
            manifest, root = None, paths.normalize_root(options.input)
        path_root = None
        if options.record_kind == "path":
            path_root = paths.normalize_root(options.path_root) if options.path_root else root
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
            records=records,
        )

    def candidate_rules(self) -> CandidateRules:
        """The rules each input is listed by (its key, label, group and path)."""
        o = self.options
        return CandidateRules(
            root=self.input_root,
            path_root=self.path_root,
            kind=o.record_kind,
            vocabulary=frozenset(self.vocabulary) if self.vocabulary else None,
            group_by=o.group_by,
        )


def has_at_least(job: Job, n: int) -> bool:
    """Whether the job's input lists at least ``n`` entries (a record input: about ``n``
    records); stops counting at ``n``.

    Cheap by construction: a walk, a bucket listing or a read that ends early on
    large inputs (a bucket lists a thousand objects a request). Errors count as
    small: preflight reports them properly.
    """
    manifest = job.manifest
    count = 0
    try:
        if job.records:
            return _records_at_least(job, n)
        if manifest is not None:
            lines = n + 1 if is_csv(manifest) else n  # a CSV's header is no input
            from beam_jobs.filesystems import open_text  # Beam's, for a URL

            with open_text(manifest) as f:
                for line in f:
                    count += bool(line.strip())
                    if count >= lines:
                        return True
            return False
        if paths.is_url(job.input_root):
            from apache_beam.io.filesystems import FileSystems

            listed = FileSystems.match([job.input_root + "/**"], limits=[n])[0]
            return len(listed.metadata_list) >= n
        for _, _, files in os.walk(job.input_root, followlinks=True):
            count += len(files)
            if count >= n:
                return True
    except (OSError, ValueError, EOFError):  # not there, unreadable, refused: small
        return False
    return False


def _records_at_least(job: Job, n: int) -> bool:
    """Whether a record input's files hold about ``n`` records: each file counts its size
    over the first record's (at least one), so a few large files count what they hold.
    Lists up to ``2n`` files (a folder's other files are no inputs) and reads one
    record; a local folder of ``2n`` files or more is many, unread (nor Beam imported:
    the fork server imports it meanwhile)."""
    folder = not is_glob(job.options.input)
    if job.records == job.input_root + "/**" and not paths.is_url(job.input_root):
        found = list(itertools.islice(paths.local_files(job.input_root), 2 * n))
        if len(found) >= 2 * n:
            return True
        listed = [(path, os.path.getsize(path)) for path in found]
    else:
        from apache_beam.io.filesystems import FileSystems

        matched = FileSystems.match([job.records], limits=[2 * n])[0].metadata_list
        listed = [(m.path, m.size_in_bytes) for m in matched]
    from beam_jobs.record_formats import record_format

    fmt = record_format(job.options.input_format)
    if folder:  # the files its format names
        root = job.input_root
        listed = [(p, size) for p, size in listed if fmt.named(paths.relative_to(root, p))]
    listed.sort()
    first = fmt.first(listed[0][0]) if listed else None
    record = _stored_bytes(first) if first else 1
    count = 0
    for _, size in listed:
        count += max(1, size // record)
        if count >= n:
            return True
    return False


def _stored_bytes(features: dict) -> int:
    """About the bytes a record of ``features`` (``parse_features``' shape) takes in its
    file: each feature's name and values, a few bytes of framing each."""
    distinct = {id(vs): vs for _, vs in features.values()}.values()  # an alias counted once
    values = (len(v) if isinstance(v, bytes) else 8 for vs in distinct for v in vs)
    return 16 + sum(len(name) + 8 for name in features) + sum(values)
