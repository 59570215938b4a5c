"""Follows convert's options and make_dataset's data_dir through the calls.

    .venv/bin/python tests/call_walk.py

Records, in call order, each project function's first call that receives the
options (or the Job, or a path either names: the Job's as resolved); prints the
modules entered, how often, and how many entries return to a module already
left. A walk that goes one way enters each module once. ``tests/test_call_walk.py``
pins convert's counts.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"
PACKAGES = ("convert_core/", "beam_jobs/", "schemas/", "reader/", "audit/", "evenshard/")


def trace(fn, wanted: list) -> list[tuple[str, str]]:
    """(module, function) of every project call whose arguments hold a ``wanted`` value."""
    seq = []

    def profile(frame, event, arg):
        path = frame.f_code.co_filename
        if event != "call" or not path.startswith(ROOT):
            return
        if not path[len(ROOT) :].startswith(PACKAGES):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        args = [frame.f_locals.get(n) for n in names]
        if any(a is w or (isinstance(a, str) and a == w) for a in args for w in wanted):
            seq.append((path[len(ROOT) : -3].replace("/", "."), code.co_name))

    before = sys.getprofile()  # a profiler already running (a plugin's) is handed back
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(before)
    return seq


def runs_of(seq: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The trace as runs of one module: (module, its functions first called there)."""
    seen: set = set()
    seq = [c for c in seq if not (c in seen or seen.add(c))]  # each function's first call
    runs: list[tuple[str, list[str]]] = []
    for module, function in seq:
        if not runs or runs[-1][0] != module:
            runs.append((module, [function]))
        else:
            runs[-1][1].append(function)
    return runs


def counts(runs: list[tuple[str, list[str]]]) -> tuple[int, int]:
    """(modules entered, entries that return to a module already left)."""
    entries = collections.Counter(m for m, _ in runs)
    return len(entries), sum(c - 1 for c in entries.values())


def report(name: str, seq: list[tuple[str, str]]) -> None:
    runs = runs_of(seq)
    entries = collections.Counter(m for m, _ in runs)
    modules, returns = counts(runs)
    print(f"== {name}: {modules} modules, {len(runs)} entries, {returns} returns")
    print("   " + ", ".join(f"{m} {c}" for m, c in entries.most_common()))
    print("   " + " -> ".join(f"{m}({','.join(f)})" for m, f in runs))


def convert_walk(tmp: str) -> list[tuple[str, str]]:
    """The trace of a convert of a small image folder made under ``tmp``."""
    from beam_jobs import convert
    from convert_core import preflight
    from convert_core.job import Job
    from convert_core.options import parse_args
    from evenshard import synthetic

    synthetic.make_image_folder(f"{tmp}/images", num_labels=2, per_label=6)
    argv = [f"--input={tmp}/images", f"--output_dir={tmp}/out", "--direct_running_mode=in_memory"]
    options, beam_args = parse_args(argv)
    wanted = [options, options.input, options.output_dir]
    resolve, check = Job.__dict__["of"], preflight.preflight

    def traced(job: Job) -> Job:
        """The Job from here on, and every path it resolved."""
        wanted.append(job)
        wanted.extend(v for v in vars(job).values() if isinstance(v, str))
        return job

    Job.of = classmethod(lambda cls, o: traced(resolve.__func__(cls, o)))
    preflight.preflight = lambda job, records=None, offline=False: traced(
        check(job, records, offline)
    )
    try:
        return trace(lambda: convert.convert(options, beam_args), wanted)
    finally:
        Job.of, preflight.preflight = resolve, check


def main() -> None:
    sys.path.insert(0, ROOT)
    tmp = tempfile.mkdtemp()
    report("convert's options", convert_walk(tmp))
    import reader

    out = f"{tmp}/out"
    make = lambda: reader.make_dataset(out, "train", 2, image_size=(8, 8))  # noqa: E731
    report("make_dataset's data_dir", trace(make, [out]))


if __name__ == "__main__":
    main()
