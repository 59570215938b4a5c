"""``evenshard convert``: the command's side of a conversion (``beam_jobs.convert``
does the work): its exit codes, its one-line errors, its summary, and Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time

from schemas.dataset_info import DatasetInfo

INTERRUPTED = (
    "evenshard convert: interrupted; run the same command again: it clears what this run left"
)


def _error(message: str) -> None:
    print(f"evenshard convert: error: {message}", file=sys.stderr)


def run(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    """``evenshard convert``: the conversion, then its summary; one line for a mistake,
    a refusal, or a file system that stopped it. Returns the exit code."""
    from beam_jobs import convert
    from beam_jobs.forked_workers import WorkerLost
    from convert_core.options import DatasetRefused, UserError, from_namespace
    from schemas.errors import Error

    # The runner logs a failing step's traceback at ERROR; ours are re-raised
    # (or shown as one line) below, so its copy is noise.
    logging.getLogger("apache_beam.runners").setLevel(logging.CRITICAL)
    start = time.monotonic()
    try:
        options = from_namespace(args)
        info = convert.convert(options, pipeline_args)
    except UserError as e:
        _error(str(e))
        return 2
    except (DatasetRefused, WorkerLost) as e:
        _error(str(e))
        return 1
    except Error as e:  # raised in a step (a user's --near_embedding function's output)
        _error(_STEP.sub("", str(e)))
        return 1
    except Exception as e:  # a disk that fills, a folder that goes: one line
        failure = io_failure(str(e), args.output_dir) or raised_in_a_worker(str(e))
        if failure is None:
            raise
        _error(failure)
        return 1
    if info.get("dry_run"):
        print("evenshard convert: dry run: the pipeline was translated, nothing was submitted")
        print("  steps: " + " -> ".join(info["steps"]))
        return 0
    took = time.monotonic() - start
    print(summary(DatasetInfo.of(info), options.output_dir, took, info.get("runner")))
    return 0


# The runner's note of the step an error was raised in, at the end of its message.
_STEP = re.compile(r" \[while running '[^']*'\]$")

# An exception's line in a traceback's text: its qualified name at the line's start
_RAISED = re.compile(r"^([A-Za-z_][\w.]*): (.+)$", re.MULTILINE)
_OURS = ("schemas.", "convert_core.", "beam_jobs.", "reader.", "audit.", "evenshard.")


def raised_in_a_worker(message: str) -> str | None:
    """evenshard's one line where a worker process raised it (the multi-processing
    runner hands back the worker's traceback as text), or None: the last exception of
    the text must be evenshard's (one raised while handling it is a fault, shown
    whole)."""
    found = _RAISED.findall(message)
    if not found or not found[-1][0].startswith(_OURS):
        return None
    return _STEP.sub("", found[-1][1])


# A system error as Python words it, somewhere in the runner's wrapped message.
_OS_ERROR = re.compile(r"\[Errno (\d+)\] ([^:'\n]+)(?:: '([^'\n]+)')?")


def io_failure(message: str, output_dir: str) -> str | None:
    """One line for a run that a file system stopped (disk full, quota, read-only, the
    output folder gone or not writable), or None for any other failure."""
    import errno

    found = _OS_ERROR.search(message)
    if not found:
        return None
    code, what, path = int(found.group(1)), found.group(2).strip(), found.group(3)
    if code not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.ENOENT):
        return None
    folders = (output_dir.rstrip("/"), os.path.abspath(output_dir))  # as typed, as resolved
    if code == errno.ENOENT and not (path or "").startswith(folders):
        return None  # an input that vanished is a reject, not this
    return (
        f"writing {path or output_dir} failed: {what}; the dataset is unfinished (no "
        f"dataset_info.json). Fix it and run the same command again: it clears the leftovers"
    )


def summary(info: DatasetInfo, output_dir: str, seconds: float, runner: str | None = None) -> str:
    """What ``evenshard convert`` prints when it is done (``runner``: how it ran)."""
    rejects = info.rejects
    lines = [
        f"evenshard convert: {info.inputs} inputs -> {info.num_examples} written, "
        f"{rejects.total} rejected, in {seconds:.1f} s",
        f"  {'split':<12}{'examples':>10}{'shards':>8}{'bytes':>14}",
    ]
    for s in info.splits:
        mb = f"{s.num_bytes / 1e6:,.1f} MB"
        lines.append(f"  {s.name:<12}{s.num_examples:>10}{len(s.shards):>8}{mb:>14}")
    lines += _empty_splits(info)
    if rejects.total:
        reasons = ", ".join(f"{r} {n}" for r, n in rejects.by_reason.items())
        lines.append(f"  rejects: {reasons} (see {output_dir.rstrip('/')}/{rejects.file})")
    if found := info.near_duplicates:
        from schemas.near import describe

        lines.append("  " + describe(found))
        if found.get("largest_cluster", 0) > max(10, info.inputs // 20):
            tighter = "raise --near_threshold" if "embedding" in found else "lower --near_distance"
            lines.append(
                f"  ! one cluster holds {found['largest_cluster']} of {info.inputs} inputs "
                "(one picture with many copies, or images too smooth to tell apart) and "
                f"it moves its split's share; look at it with evenshard leaks, or {tighter}"
            )
    lines.append(f"  labels: {len(info.labels)}; output: {output_dir}")
    if runner:
        lines.append(f"  runner: {runner}")
    return "\n".join(lines)


def _empty_splits(info: DatasetInfo) -> list[str]:
    """A line for each split left with no example, saying why and what gives it some."""
    options = info.split_options or {}
    fractions, mode = options.get("splits") or {}, options.get("split_mode")
    lines = []
    for s in info.splits:
        if s.num_examples or s.name not in fractions:
            continue
        share = f"its {fractions[s.name] * 100:g} %"
        if info.inputs * fractions[s.name] < 1:
            why = f"{share} of {info.inputs} inputs is under one"
        elif mode == "hash":
            why = (
                f"each of {info.inputs} inputs goes where its key's hash falls "
                "(--split_mode exact cuts each label at the fractions)"
            )
        else:
            why = f"each label's share of {share} rounds to none"
        lines.append(f"  ! {s.name} is empty: {why}; give more inputs or a larger fraction")
    return lines


# How long a convert stopped by Ctrl-C may take to unwind (release its output
# folder's lock, remove Beam's temp folder) before it just ends.
UNWIND_S = 10


def stop_now(_signum, _frame) -> None:
    """Ctrl-C in a local convert: one line, then the run unwinds quietly (exit code 130).

    Unwinding Beam's runner with its workers still running printed some 300 lines
    of their tracebacks. Here the fork server and its workers (which ignore Ctrl-C)
    are stopped first, stderr goes quiet, and a KeyboardInterrupt unwinds the run
    as usual: the output folder's lock is released and Beam's temp folder removed.
    The next run clears what this one wrote, as after any run that died. Unwinding
    longer than ``UNWIND_S``, or a second Ctrl-C, ends the process there.
    """
    from beam_jobs import forked_workers

    def end(*_):
        os._exit(130)

    signal.signal(signal.SIGINT, end)
    signal.signal(signal.SIGALRM, end)
    signal.alarm(UNWIND_S)
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    forked_workers.stop_now()
    raise KeyboardInterrupt
