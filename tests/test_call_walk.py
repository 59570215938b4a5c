"""Convert's options go one way through the calls (issue 56's aim, ``tests/call_walk.py``).

The trace follows the options, the Job and every path it resolved through each
project function that receives one, in a real in-process convert.
"""

from __future__ import annotations

from tests.call_walk import convert_walk, counts, runs_of


def test_convert_options_visit_at_most_14_modules_with_at_most_8_returns(tmp_path):
    runs = runs_of(convert_walk(str(tmp_path)))
    modules, returns = counts(runs)
    walk = " -> ".join(m for m, _ in runs)
    assert modules <= 14, walk
    assert returns <= 8, walk
    # the Job is complete after preflight: wiring the steps calls nothing back into it
    assert [m for m, _ in runs].count("convert_core.job") == 1, walk
