"""The output folder: checked before any work, locked while written, only our own files removed.

Rules (docs/convert.md#output-folder; that it holds no input is ``preflight``'s check):
- A folder that is a file, or cannot be created or written, stops the job
  before any work.
- A lock file, created only if absent in one step (local: ``O_EXCL``; a
  bucket: a conditional write, ``schemas.stores``), is held while the job
  runs; a second convert into the same folder is refused. A lock left by a
  killed run (same host, its process gone) is taken over with a warning; the
  lock is removed only if it is still the one taken (its token). Other URL
  schemes are not locked: there each job needs its own folder.
- Convert removes only files it wrote, known by name: those its
  ``dataset_info.json`` lists, those a run that died recorded in
  ``.incomplete/`` as renamed into place, its files of fixed name and their
  temp files (``owned_files``); never a file because its name matches a
  pattern. A folder is convert's when it holds the marker file (written
  first) or a finished dataset. Files of convert's names in a folder that is
  not convert's are the user's: the job refuses.
- A run refused for its inputs leaves its one line in the folder
  (``refuse``); the claim raises it as it ends (``DatasetRefused``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket

from convert_core import paths
from convert_core.describe import (
    check_counts,
    check_planned,
    dataset_files,
    dataset_info,
    inputs_changed,
    too_many_rejects,
)
from convert_core.job import Job
from convert_core.options import DatasetRefused, UserError
from convert_core.records import Reject
from convert_core.rejects import parse_rejects, rejects_text
from schemas import layout, storage

log = logging.getLogger(__name__)

MARKER = b"evenshard convert writes this folder\n"  # a folder holding it is convert's


@contextlib.contextmanager
def claim(job: Job):
    """Locks and prepares the output folder for the job's run (``preflight`` checked it
    holds no input); unlocks when the run ends, and raises the refusal it wrote, if any
    (here, in the driver, never in a worker: one line on every runner).

    Raises:
        UserError: the folder is not writable, is locked by a running convert, holds a
            finished dataset (without ``--overwrite``) or files of convert's names that
            it did not write.
        DatasetRefused: the run ended without a dataset because of its inputs.
    """
    out = job.output_dir
    lock = None
    try:
        if not paths.is_url(out):
            if os.path.exists(out) and not os.path.isdir(out):
                raise UserError(f"--output_dir {out} is a file, not a folder")
            os.makedirs(out, exist_ok=True)
        lock = _lock(out)
    except OSError as e:
        raise UserError(f"--output_dir {out} cannot be written: {e.strerror or e}") from None
    try:
        _prepare(out, job.incomplete_dir, job.options.overwrite)
        yield
    finally:
        if lock:
            with contextlib.suppress(OSError):
                storage.remove_if(*lock)
    refused = layout.join(out, layout.REFUSED_FILE)
    if storage.exists(refused):
        raise DatasetRefused(storage.read_bytes(refused).decode("utf-8"))


def refuse(out: str, message: str) -> None:
    """Ends the run without a dataset: ``message`` (one line) for the driver to raise
    (``claim``); written by the run's last step, wherever it runs."""
    log.info("evenshard: no dataset: %s", message)
    storage.write_atomically(layout.join(out, layout.REFUSED_FILE), message.encode("utf-8"))


def _lock(out: str) -> tuple[str, int]:
    """Takes the folder's lock: (its path, its generation)."""
    lock = layout.join(out, layout.LOCK_FILE)
    me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
    for _ in range(3):
        try:
            return lock, storage.create_new(lock, me)
        except FileExistsError:
            pass
        try:
            data, generation = storage.read_versioned(lock)
        except FileNotFoundError:
            continue  # released meanwhile
        holder = _holder(data)
        if holder is not None:
            raise UserError(
                f"--output_dir {out} is being written by another convert (pid "
                f"{holder['pid']} on {holder['host']}); wait for it, or choose another "
                f"folder (a stale lock can be removed: {lock})"
            )
        log.warning("evenshard: taking over the lock of a convert that is gone: %s", lock)
        storage.remove_if(lock, generation)
    raise UserError(f"--output_dir {out}: could not take the lock {lock}")


def _holder(data: bytes) -> dict | None:
    """The lock's holder if it is still running (same host, live pid); None if stale."""
    try:
        holder = json.loads(data)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError):
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


def _prepare(out: str, incomplete: str, overwrite: bool) -> None:
    """Refuses a finished dataset without --overwrite and files that are not ours;
    removes what earlier runs wrote, by name; writes the marker.

    ``dataset_info.json`` goes last, so a folder is never a finished dataset
    with some of its files missing, and a removal cut short is finished by
    the next run (the info still names what is left).
    """
    info = layout.join(out, layout.INFO_FILE)
    marker = layout.join(out, layout.MARKER_FILE)
    finished = storage.exists(info)
    ours = finished or storage.exists(marker)
    if finished and not overwrite:
        raise UserError(
            f"--output_dir {out} holds a finished dataset; pass --overwrite "
            "to replace it, or choose another folder"
        )
    if not ours:
        claimed = _matches(out, layout.CLAIMED_PATTERNS)
        if claimed:
            names = ", ".join(paths.relative_to(out, p) or p for p in claimed[:5])
            raise UserError(
                f"--output_dir {out} holds files that evenshard did not write ({names}"
                f"{', ...' if len(claimed) > 5 else ''}); choose an empty or new folder"
            )
    else:
        earlier = [p for p in owned_files(out, incomplete) if storage.exists(p)]
        if earlier:
            log.warning("evenshard: removing %d files of an earlier run from %s", len(earlier), out)
            storage.delete(earlier)
        if finished:
            storage.delete([info])
        kept = _matches(out, layout.CLAIMED_PATTERNS)
        if kept:
            log.warning(
                "evenshard: %s holds %d files of convert's names that no earlier run "
                "recorded as its own; they are kept: %s",
                out,
                len(kept),
                ", ".join(paths.relative_to(out, p) or p for p in kept[:5]),
            )
    if not storage.exists(marker):
        storage.write_atomically(marker, MARKER)


def owned_files(out: str, incomplete: str) -> list[str]:
    """The files earlier runs of convert wrote in ``out``, known by name, never by pattern
    (``incomplete``: its ``.incomplete/`` folder).

    - the shards and indexes a ``dataset_info.json`` lists (the info itself
      is removed last, by ``_prepare``);
    - the shards (and indexes) recorded in ``.incomplete/`` as renamed into
      place by a run that died before its info, and ``.incomplete/`` itself;
    - the files of fixed name (``schema.pbtxt``, ``labels.txt``,
      ``rejects/rejects.jsonl``) and their temp files (``NAME.tmp-<32 hex>``).
    """
    from schemas.info import DatasetError, parse_info

    names: list[str] = []
    info = layout.join(out, layout.INFO_FILE)
    if storage.exists(info):
        try:
            parsed = parse_info(storage.read_bytes(info), info)
        except DatasetError as e:
            log.warning("evenshard: %s; the shards it lists are not removed", e)
        else:
            for split in parsed["splits"].values():
                for shard in split.get("shards", []):
                    names += [shard["file"], *layout.beside(shard["file"])]
    for path in _matches(incomplete, ["*" + layout.OWNED_SUFFIX]):
        name = path.rsplit("/", 1)[-1].removesuffix(layout.OWNED_SUFFIX)
        if layout.is_shard_name(name):
            names += [name, *layout.beside(name)]
    names += [layout.SCHEMA_FILE, layout.LABELS_FILE, layout.REJECTS_FILE]
    for path in _matches(out, ["*.tmp-*", "rejects/*.tmp-*"]):
        rel = paths.relative_to(out, path)
        if rel and layout.is_temp_of_fixed_file(rel):
            names.append(rel)
    files = [layout.join(out, n) for n in dict.fromkeys(names) if n]
    return files + storage.files_under(incomplete)


def _matches(folder: str, patterns) -> list[str]:
    return sorted({path for p in patterns for path, _ in storage.match(p, folder=folder)})


def write_rejects(path: str, rejects: list[Reject]) -> None:
    """Writes the rejects file (``rejects_text``)."""
    storage.write_atomically(path, rejects_text(rejects))


def add_rejects(path: str, rejects: list[Reject]) -> None:
    """Adds ``rejects`` to the rejects file written already (once: a retried finish
    finds them there)."""
    written = parse_rejects(storage.read_bytes(path))
    write_rejects(path, written + [r for r in rejects if r not in set(written)])


def finish(
    out: str,
    incomplete: str,
    rejects_file: str,
    settings: dict,
    shards: list[dict],
    plan: dict,
    vocab: dict,
    gate: dict,
    reject_summary: dict,
    changed: list[Reject],
    near: list | None = None,
) -> dict | None:
    """The run's last step, once every shard and the rejects are written: the description
    (``convert_core.describe``), ``dataset_info.json`` last, then ``.incomplete/``
    removed; or no dataset (``refuse``, and None): too many rejects, or inputs that
    changed while shards were written (``changed``: added to the rejects file).

    ``settings``: what the info records of the flags (``Job.settings``); ``near``:
    ``[the summary of --dedupe near]``, or empty.
    """
    if not gate["ok"]:
        refuse(out, too_many_rejects(gate, rejects_file))
        return None
    info = dataset_info(
        settings, shards, plan, vocab, gate, reject_summary, near[0] if near else None
    )
    written = check_counts(info, gate, changed)
    if changed:  # the shards are one short each: no balanced dataset to declare
        add_rejects(rejects_file, changed)
        refuse(out, inputs_changed(changed, rejects_file))
        return None
    check_planned(info, plan)
    for name, data in dataset_files(info, shards, vocab):  # dataset_info.json LAST
        storage.write_atomically(layout.join(out, name), data)
    # after the info, which now lists the shards: until then the records in
    # .incomplete/ say which files in the folder this run wrote
    storage.delete(storage.files_under(incomplete))
    log.info("evenshard: wrote %s examples to %s", written, out)
    return info
