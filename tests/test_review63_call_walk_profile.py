"""tests/call_walk.py's trace hands back the profile function it found (review63): it
must not switch off a profiler already running (a coverage or profiling plugin's)."""

from __future__ import annotations

import sys

from tests.call_walk import trace


def test_trace_restores_the_profiler_it_found_even_on_failure():
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
