"""reader.order.plan: the read order, a pure function of (seed, epoch, position); no TF."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from reader.order.draws import permutation
from reader.order.plan import ReadPlan

pytestmark = pytest.mark.fast  # the unit lane: make test-fast

PLANS = [
    # counts as convert writes them (equal +-1), runs read 2 or 3 at once, windows
    ReadPlan(counts=(21, 21, 20, 20, 20), seed=7, cycle=2, block=1, window=16),
    ReadPlan(counts=(21, 21, 20, 20, 20), seed=7, cycle=3, block=4, window=10),
    ReadPlan(counts=(9, 9, 8), seed=3, cycle=3, block=2, window=0, parts=2),
    # one file cut into 5 runs
    ReadPlan(counts=(40,), seed=2, cycle=4, window=7, parts=4),
    # fewer files than workers: every 3rd record from offset 2
    ReadPlan(counts=(11, 10), seed=1, cycle=2, block=1, window=5, stride=3, offset=2),
    ReadPlan(counts=(11, 10, 10), seed=None, cycle=2, block=3),
]


def simulate(plan: ReadPlan, epoch: int, position: int) -> list[int]:
    """Reads the way the tf.data reader does from ``plan.resume``: plain Python iterators,
    independent of ``epoch_order``'s sort-based construction."""
    at = plan.resume(epoch, position)
    starts = np.concatenate([[0], np.cumsum(plan.counts)[:-1]])
    runs = [
        iter(range(starts[f] + a, starts[f] + b))
        for f, a, b in zip(at.runs.file, at.runs.start, at.runs.stop)
    ]
    raw = []
    for g in range(0, len(runs), plan.cycle):
        open_ = runs[g : g + plan.cycle]
        while open_:
            still = []
            for run in open_:
                block = list(itertools.islice(run, plan.block))
                raw += block
                if len(block) == plan.block:
                    still.append(run)
            open_ = still
    mine = raw[at.raw_skip :][:: plan.stride]
    out = []
    for w, i in enumerate(range(0, len(mine), plan.window or len(mine) or 1)):
        chunk = mine[i : i + plan.window] if plan.window else mine[i:]
        if plan.windowed:
            chunk = [
                chunk[j] for j in plan.window_permutation(epoch, at.first_window + w, len(chunk))
            ]
        out += chunk
    return out[at.tail_skip :]


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_every_position_resumes_to_the_tail_of_the_epoch(plan):
    for epoch in (0, 1):
        order = plan.epoch_order(epoch)
        for position in range(plan.size):
            assert simulate(plan, epoch, position) == list(order[position:]), position


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_an_epoch_reads_each_of_the_workers_records_once(plan):
    total = sum(plan.counts)
    for epoch in range(3):
        order = plan.epoch_order(epoch)
        assert len(order) == len(set(order.tolist())) == plan.size
        assert set(order.tolist()) <= set(range(total))


def test_workers_sharing_files_split_them_exactly():
    plans = [ReadPlan((11, 10), seed=1, cycle=2, window=4, stride=3, offset=w) for w in range(3)]
    for epoch in range(2):
        union = np.concatenate([p.epoch_order(epoch) for p in plans])
        assert sorted(union.tolist()) == list(range(21))


def test_seeded_orders_repeat_and_change_with_the_epoch_and_seed():
    plan = PLANS[0]
    assert (plan.epoch_order(1) == plan.epoch_order(1)).all()
    assert (plan.epoch_order(1) != plan.epoch_order(2)).any()
    other = ReadPlan(plan.counts, seed=8, cycle=2, window=16)
    assert (plan.epoch_order(1) != other.epoch_order(1)).any()


def test_unseeded_plans_read_files_round_robin_in_stored_order():
    plan = ReadPlan((3, 3, 2), seed=None, cycle=2, block=1)
    # group (file 0: ids 0-2, file 1: ids 3-5), then file 2 (ids 6-7)
    assert plan.epoch_order(0).tolist() == [0, 3, 1, 4, 2, 5, 6, 7]
    assert (plan.epoch_order(5) == plan.epoch_order(0)).all()


def test_runs_change_which_records_meet():
    """With whole files, record j of every file lands in the same window every epoch."""
    plan = ReadPlan((100,) * 8, seed=0, cycle=8, window=40)
    windows = [
        {frozenset(plan.epoch_order(e)[i : i + 40].tolist()) for i in range(0, 800, 40)}
        for e in range(2)
    ]
    assert not windows[0] & windows[1]


def test_runs_cover_each_file_once_and_cut_it_anew_every_epoch():
    plan = ReadPlan((10, 7, 1, 0), seed=5, cycle=4, parts=3)
    for epoch in range(2):
        runs = plan.runs(epoch)
        assert len(runs.file) == plan.num_runs == 16
        for f, n in enumerate(plan.counts):
            mine = sorted((a, b) for g, a, b in zip(runs.file, runs.start, runs.stop) if g == f)
            assert mine[0][0] == 0 and mine[-1][1] == n
            assert all(b == a2 for (_, b), (a2, _) in zip(mine, mine[1:]))  # contiguous
    cuts = [sorted(plan.runs(e).start[plan.runs(e).file == 0].tolist()) for e in range(2)]
    assert cuts[0] != cuts[1]


def test_permutations_are_pinned_across_installs():
    # A changed hash would silently change every seeded read order: pin one.
    assert permutation(10, 0, 1, 2).tolist() == [3, 2, 7, 1, 5, 0, 4, 6, 8, 9]


def test_positions_outside_the_epoch_are_refused():
    with pytest.raises(ValueError, match="outside"):
        PLANS[0].resume(0, PLANS[0].size)
