"""Where the spread views of an image go (``reader/order/views.py``), checked over
small grids of views, spreads, blocks and worker counts, without reading a dataset."""

from __future__ import annotations

import itertools

import pytest

from reader.order.views import handover, restart, rounds, started

GRID = [
    (views, spread, blocks)
    for views in (2, 3, 4)
    for spread in (1, 2, 3)
    for blocks in (spread, spread + 1, 2 * spread + 3)
]


@pytest.mark.parametrize("views,spread,blocks", GRID)
def test_rounds_send_each_view_once_spread_apart_and_resume_anywhere(views, spread, blocks):
    order = list(rounds(views, spread, blocks))
    assert sorted(order) == sorted(itertools.product(range(blocks), range(views)))
    at = {item: n for n, item in enumerate(order)}
    assert all(at[(b, v + 1)] - at[(b, v)] >= spread for b, v in at if v + 1 < views)
    for done in range(len(order) + 1):
        first, skip = restart(done, views, spread, blocks)
        rest = [(b + first, v) for b, v in rounds(views, spread, blocks - first)][skip:]
        assert rest == order[done:], done
        opened = min(started(done, views, spread), blocks)  # started counts endless rounds
        assert opened == (max(b for b, _ in order[:done]) + 1 if done else 0)


@pytest.mark.parametrize("views,spread,blocks", GRID)
@pytest.mark.parametrize("old,new", [(1, 2), (2, 1), (3, 2), (2, 3), (5, 2), (2, 5)])
def test_a_handover_sends_every_owed_view_once_on_time_and_evenly(views, spread, blocks, old, new):
    """Saved by ``old`` workers after any batch between the views of their images and
    resumed by ``new``: the owed views all go out, once, never closer than ``spread``
    batches to another view of their image (in the run's batch numbers), every worker's
    stretch as long and as much of its own read, at most one padding batch each."""
    order = list(rounds(views, spread, blocks))
    for done in range(1, len(order)):
        first, skip = restart(done, views, spread, blocks)
        if skip == 0:
            continue
        when = {(w, b, v): n for w in range(old) for n, (b, v) in enumerate(order[:done])}
        plans = [handover(views, spread, skip, [blocks - first] * old, new, m) for m in range(new)]
        opened = plans[0][0]
        stretches = [plan for _, plan in plans]
        assert len({len(p) for p in stretches}) == 1
        assert len({p.count("own") for p in stretches}) == 1
        assert max(p.count(None) for p in stretches) <= 1
        for plan in stretches:
            for step, item in enumerate(plan):
                if isinstance(item, tuple):
                    w, b, v = item
                    assert (w, b + first, v) not in when
                    when[(w, b + first, v)] = done + step
        owed = itertools.product(range(old), range(min(first + opened, blocks)), range(views))
        assert set(when) == set(owed)  # the later blocks: the new workers' own read
        gaps = [when[(w, b, v + 1)] - n for (w, b, v), n in when.items() if v + 1 < views]
        assert min(gaps) >= spread


@pytest.mark.parametrize("views,spread,blocks", GRID)
@pytest.mark.parametrize("old,new", [(3, 2), (2, 3), (5, 2), (2, 1)])
def test_a_handover_of_unequal_workers_pads_at_most_one_batch(views, spread, blocks, old, new):
    """Issue 41.2: old workers of unequal block counts (a split that does not deal
    evenly), saved after any batch between the views of their images, resumed by
    ``new``, whose own reads have ``own`` outputs each (endless, as many as the stretch
    asks, fewer: a resize near the read's end): every owed view once, never before the
    save; at most one padding batch a worker and never more own batches than its own
    read has; with enough of its own read, every view ``spread`` batches from the others
    of its image (was: a stretch of t * ceil(old/new) batches, the own read too short to
    fill it: up to 15 padding batches of 36)."""
    totals = [blocks + (2 * w) % 3 for w in range(old)]
    orders = [list(rounds(views, spread, t)) for t in totals]
    for done in range(1, min(len(o) for o in orders)):
        first, skip = restart(done, views, spread, None)
        if skip == 0:
            continue
        lanes = [max(t - first, 0) for t in totals]
        unbounded = [handover(views, spread, skip, lanes, new, m) for m in range(new)]
        need = unbounded[0][1].count("own")  # the own batches of the stretch, endless
        for own in (None, need, need // 2, 0):
            plans = [handover(views, spread, skip, lanes, new, m, own)[1] for m in range(new)]
            if own == need:
                assert plans == [plan for _, plan in unbounded]
            assert len({len(p) for p in plans}) == 1
            assert len({p.count("own") for p in plans}) == 1
            assert own is None or plans[0].count("own") <= own
            assert max(p.count(None) for p in plans) <= 1
            when = {
                (w, b, v): n - done for w in range(old) for n, (b, v) in enumerate(orders[w][:done])
            }
            for plan in plans:
                for step, item in enumerate(plan):
                    if isinstance(item, tuple):
                        w, b, v = item
                        assert (w, b + first, v) not in when
                        when[(w, b + first, v)] = step
            opened = unbounded[0][0]
            owed = {
                (w, b, v)
                for w in range(old)
                for b in range(min(first + opened, totals[w]))
                for v in range(views)
            }
            assert set(when) == owed
            if own is None or own == need:
                gaps = [when[(w, b, v + 1)] - n for (w, b, v), n in when.items() if v + 1 < views]
                assert min(gaps) >= spread
