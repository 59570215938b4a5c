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
