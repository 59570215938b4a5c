"""The output folder: checked before any work, locked while written, only our own files removed.

Rules (docs/convert.md#output-folder):
- The folder may not hold the job's inputs: not inside the input folder, not
  the manifest's or the ``--labels`` file's folder (real paths compared, so a
  symlink does not get around it).
- A folder that is a file, or cannot be created or written, stops the job
  before any work.
- A lock file, created atomically, is held while the job runs; a second
  convert into the same folder is refused. A lock left by a killed run (its
  process is gone) is taken over with a warning. Local folders only: object
  stores have no atomic create, so there each job needs its own folder.
- Convert removes only files it wrote: a folder is convert's when it holds
  the marker file (written first) or a finished dataset. Files of convert's
  names in a folder that is not convert's are the user's: the job refuses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket

from beam_jobs import paths
from beam_jobs.options import Job, UserError
from schemas import layout

log = logging.getLogger(__name__)


def _real(path: str) -> str:
    return path if paths.is_url(path) else os.path.realpath(path)


def _inside(folder: str, path: str) -> bool:
    return folder == path or paths.relative_to(folder, path) is not None


def check_not_an_input(job: Job) -> None:
    """Refuses an output folder that holds, or lies inside, the job's inputs."""
    o = job.options
    out = _real(paths.normalize_root(o.output_dir))
    if not o.is_manifest and _inside(_real(job.input_root), out):
        raise UserError(
            f"--output_dir {o.output_dir} lies inside the input folder {job.input_root}; "
            "choose a folder outside it"
        )
    files = (("--input", o.input if o.is_manifest else None), ("--labels", o.labels_file))
    for flag, path in files:
        if path and _real(paths.normalize_root(paths.posix_dirname(path))) == out:
            raise UserError(
                f"--output_dir {o.output_dir} holds the {flag} file {path}; choose another "
                "folder (convert writes labels.txt, schema.pbtxt and rejects/ there)"
            )


@contextlib.contextmanager
def claim(job: Job):
    """Checks, locks and prepares the output folder for the job; unlocks when it ends.

    Raises:
        UserError: the folder holds the inputs, is not writable, is locked by
            a running convert, holds a finished dataset (without
            ``--overwrite``) or files of convert's names that it did not write.
    """
    check_not_an_input(job)
    out = job.options.output_dir.rstrip("/")
    if paths.is_url(out):
        _prepare(job, out)
        yield
        return
    try:
        if os.path.exists(out) and not os.path.isdir(out):
            raise UserError(f"--output_dir {out} is a file, not a folder")
        os.makedirs(out, exist_ok=True)
        lock = _lock(out)
    except OSError as e:
        raise UserError(f"--output_dir {out} cannot be written: {e.strerror or e}") from None
    try:
        _prepare(job, out)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock)


def _lock(out: str) -> str:
    lock = layout.join(out, layout.LOCK_FILE)
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder is not None:
                raise UserError(
                    f"--output_dir {out} is being written by another convert (pid "
                    f"{holder['pid']} on {holder['host']}); wait for it, or choose another "
                    f"folder (a stale lock can be removed: {lock})"
                ) from None
            log.warning("evenshard: taking over the lock of a convert that is gone: %s", lock)
            os.remove(lock)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return lock
    raise UserError(f"--output_dir {out}: could not take the lock {lock}")


def _holder(lock: str) -> dict | None:
    """The lock's holder if it is still running (same host, live pid); None if stale."""
    try:
        with open(lock) as f:
            holder = json.load(f)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable or half-written: from a run that died while locking
    if host != socket.gethostname():
        return holder  # cannot tell from here: assume it runs
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return holder


def _prepare(job: Job, out: str) -> None:
    """Refuses a finished dataset without --overwrite and files that are not ours;
    removes what earlier runs left; writes the marker.

    ``dataset_info.json`` goes first, so a folder is never a finished dataset
    with some of its files missing.
    """
    from apache_beam.io.filesystems import FileSystems

    info = layout.join(out, layout.INFO_FILE)
    marker = layout.join(out, layout.MARKER_FILE)
    finished = FileSystems.exists(info)
    ours = finished or FileSystems.exists(marker)
    if finished and not job.options.overwrite:
        raise UserError(
            f"--output_dir {out} holds a finished dataset; pass --overwrite "
            "to replace it, or choose another folder"
        )
    leftovers = sorted(
        m.path
        for r in FileSystems.match([layout.join(out, p) for p in layout.WRITTEN_PATTERNS])
        for m in r.metadata_list
    )
    if leftovers and not ours:
        names = ", ".join(paths.relative_to(out, p) or p for p in leftovers[:5])
        raise UserError(
            f"--output_dir {out} holds files that evenshard did not write ({names}"
            f"{', ...' if len(leftovers) > 5 else ''}); choose an empty or new folder"
        )
    if finished:
        FileSystems.delete([info])
    if leftovers:
        log.warning("evenshard: removing %d files of an earlier run from %s", len(leftovers), out)
        FileSystems.delete(leftovers)
    if not FileSystems.exists(marker):
        from beam_jobs.finalize import write_atomically

        write_atomically(marker, b"evenshard convert writes this folder\n")
