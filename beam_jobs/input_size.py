"""How large a job's input is, cheaply: whether it lists at least N entries, which
picks the local runner's mode (``runners.local_default``). Nothing here imports Beam
(a record input's format module is imported when one is looked at): the driver asks
before its fork server starts (``convert.convert``)."""

from __future__ import annotations

import itertools
import os

from convert_core import paths
from convert_core.job import Job
from convert_core.options import is_csv
from convert_core.record_rules import is_glob
from schemas import storage


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
            with storage.open_text(manifest) as f:
                for line in f:
                    count += bool(line.strip())
                    if count >= lines:
                        return True
            return False
        if paths.is_url(job.input_root):
            return len(storage.match("**", n, folder=job.input_root)) >= n
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
    elif job.records == job.input_root + "/**":  # a bucket folder, its name no pattern
        listed = storage.match("**", 2 * n, folder=job.input_root)
    else:
        listed = storage.match(job.records, 2 * n)
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
