"""Convert's options go one way through the calls (issue 56's aim, ``tests/call_walk.py``).

The trace follows the options, the Job and every path it resolved through each
project function that receives one, in a real in-process convert.
"""

from __future__ import annotations

import sys

import pytest

from tests.call_walk import convert_walk, counts, runs_of, trace


def test_convert_options_visit_at_most_14_modules_with_at_most_8_returns(tmp_path):
    runs = runs_of(convert_walk(str(tmp_path)))
    modules, returns = counts(runs)
    walk = " -> ".join(m for m, _ in runs)
    assert modules <= 14, walk
    assert returns <= 8, walk
    # the Job is complete after preflight: wiring the steps calls nothing back into it
    assert [m for m, _ in runs].count("convert_core.job") == 1, walk


def test_trace_restores_the_profiler_it_found_even_on_failure():
    """A profiler already running (a coverage or profiling plugin's) is handed back."""

    def mine(frame, event, arg):
        return None

    def fails():
        raise RuntimeError("boom")

    before = sys.getprofile()
    sys.setprofile(mine)
    try:
        trace(lambda: None, [])
        assert sys.getprofile() is mine
        try:
            trace(fails, [])
        except RuntimeError:
            pass
        assert sys.getprofile() is mine
    finally:
        sys.setprofile(before)


def test_the_pipeline_is_built_only_on_a_checked_job(tmp_path):
    """``steps.build`` reads the Job's rules, which ``preflight`` adds: a Job that skipped
    it is refused at once, not deep in a step."""
    from beam_jobs.steps import build
    from convert_core.job import Job
    from convert_core.options import parse_args

    options, _ = parse_args([f"--input={tmp_path}", f"--output_dir={tmp_path}/out"])
    with pytest.raises(ValueError, match="checked by convert_core.preflight"):
        build(None, Job.of(options))
