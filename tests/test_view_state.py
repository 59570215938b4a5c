"""Issue 41: NumpyReader's state with views spread (``view_spread=D``) resumes only the
read it was saved from: other views or spread, and tampered states, are one line each,
never a read of other views or of nothing; an elastic resume between the views pads a
worker at most one batch."""

from __future__ import annotations

import json

import pytest
from controls_data import saved_after
from dataset_writer import write_dataset

import reader
from evenshard import synthetic

OPTS = dict(image_size=(8, 8), seed=4, shuffle_buffer=16, cycle_length=4, num_processes=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """60 images in 4 train shards (3 workers read 30, 15 and 15 of them)."""
    root = tmp_path_factory.mktemp("views") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=20, formats=("png",))
    out = str(tmp_path_factory.mktemp("views_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


def same(example, rng):
    return example


def read(data, batch_size=8, state=None, **kw):
    r = reader.NumpyReader(data, "train", batch_size, transform=same, **{**OPTS, **kw})
    if state is not None:
        r.load_state_dict(state)
    return r


def one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_a_state_resumes_only_the_views_and_spread_it_was_saved_with(data):
    """Issue 41.1: saved between the views of its images with views=2, view_spread=2,
    resumed with another spread or view count: one line naming the change (was: some
    (key, view) read twice, others never)."""
    saved = saved_after(read(data, views=2, view_spread=2, epochs=2), 5)
    assert saved["view_skip"] > 0
    for changed, named in (
        (dict(views=2, view_spread=1), "view_spread 2 -> 1"),
        (dict(views=3, view_spread=2), "views 2 -> 3"),
        (dict(views=2), "view_spread 2 -> together"),
    ):
        with pytest.raises(ValueError, match=named) as e:
            read(data, state=saved, epochs=2, **changed)
        assert "views and view_spread of the saved run" in one_line(e)
    again = read(data, state=saved, views=2, view_spread=2, epochs=2)
    assert len(list(again)) == len(read(data, views=2, view_spread=2, epochs=2)) - 5


def test_a_tampered_state_is_one_line_never_an_empty_read(data):
    """Issue 41.4: a view_skip or step past the read's end, a view_skip of True, a dict
    without read_state and a list: each one line naming what is wrong (was: a read of
    0 batches, a True counted as 1, a bare KeyError or TypeError)."""
    kw = dict(views=3, view_spread=2, epochs=1)
    saved = saved_after(read(data, **kw), 4)
    far = json.loads(saved["read_state"])
    far["step"] = 10**12
    for state, named in (
        ({**saved, "view_skip": 10**9}, "view_skip 1000000000: .* at most 8"),
        ({**saved, "view_skip": True}, "view_skip True"),
        ({**saved, "read_state": json.dumps(far)}, "past the end of this read"),
        ({"view_skip": 3}, "no read_state"),
        ([saved], "a dict as state_dict"),
    ):
        for workers in (1, 2):  # the saved count, and an elastic resume
            with pytest.raises(ValueError, match=named) as e:
                read(data, state=state, num_workers=workers, worker_index=0, **kw)
            one_line(e)
    bare = json.dumps({"seed": 4, "batch_size": 8})  # no num_workers: a new state
    with pytest.raises(ValueError, match="view_handover with a read_state that names no") as e:
        read(data, state={**saved, "read_state": bare, "view_handover": [1, 0]}, **kw)
    one_line(e)
    plain = saved_after(read(data, epochs=1), 2)
    far = {**json.loads(plain["read_state"]), "step": 10**12}
    with pytest.raises(ValueError, match="past the end of this read") as e:
        read(data, state={"read_state": json.dumps(far)}, epochs=1)
    one_line(e)
    # a state saved at the very end resumes to nothing, as before
    end = read(data, **kw)
    list(end)
    assert list(read(data, state=end.state_dict(), **kw)) == []


def sent_views(batches, first_step: int, sent: dict) -> int:
    """Records each real (key, epoch, view) of ``batches`` at its batch of the whole run,
    once; returns the batches of padding alone."""
    padding = 0
    for step, batch in enumerate(batches, start=first_step):
        padding += not batch["mask"].any()
        for key, epoch, view, real in zip(
            batch["key"], batch["epoch"].tolist(), batch["view"].tolist(), batch["mask"]
        ):
            if real:
                assert (key, epoch, view) not in sent
                sent[(key, epoch, view)] = step
    return padding


@pytest.mark.parametrize("epochs,stop", [(3, 16), (1, 3)])
def test_a_resize_between_the_views_pads_a_worker_at_most_one_batch(data, epochs, stop):
    """Issue 41.2: 3 workers of 30, 15 and 15 images an epoch (views=3, view_spread=2,
    batch 8) saved between the views of their images, resumed by 2: every (key, epoch,
    view) once, at most one padding batch a worker (was: 15 at batch 16 of 3
    epochs, 6 at batch 3 of 1), the views of an image 2 batches apart in the
    middle of the read (at its end, the handover's own read too short, they may not)."""
    kw = dict(views=3, view_spread=2, epochs=epochs)
    whole, sent = {}, {}
    for w in range(3):
        sent_views(read(data, num_workers=3, worker_index=w, **kw), 0, whole)
        first = read(data, num_workers=3, worker_index=w, **kw)
        it = iter(first)
        sent_views([next(it) for _ in range(stop)], 0, sent)
        it.close()
    state = first.state_dict()
    assert state["view_skip"] > 0
    for m in range(2):
        resumed = read(data, state=state, num_workers=2, worker_index=m, **kw)
        assert sent_views(list(resumed), stop, sent) <= 1
    assert set(sent) == set(whole)
    if epochs > 1:
        assert min(sent[(k, e, v + 1)] - sent[(k, e, v)] for k, e, v in sent if v < 2) >= 2


def test_mirror_views_and_views_together_are_in_the_state(data):
    """Issue 41 follow-up: a state saved with mirror_views, resumed without it (other
    crops for the odd views), and one saved with views together, resumed with other
    views or spread: one line naming the change (was: accepted without a word)."""
    kw = dict(random_crop=True, epochs=1)
    mirrored = saved_after(read(data, views=2, mirror_views=True, **kw), 2)
    together = saved_after(read(data, views=2, **kw), 2)
    for state, changed, named in (
        (mirrored, dict(views=2), "mirror_views True -> unset"),
        (together, dict(views=2, mirror_views=True), "mirror_views unset -> True"),
        (together, dict(views=4), "views 2 -> 4"),
        (together, dict(views=2, view_spread=1), "view_spread together -> 1"),
        (together, dict(views=1, batch_size=4), "views 2 -> 1"),
    ):
        with pytest.raises(ValueError, match=named) as e:
            read(data, state=state, **{**kw, **changed})
        assert "views and view_spread of the saved run" in one_line(e)
    spread = saved_after(read(data, views=2, view_spread=2, mirror_views=True, **kw), 3)
    with pytest.raises(ValueError, match="mirror_views True -> unset"):
        read(data, state=spread, views=2, view_spread=2, **kw)
    whole = len(read(data, views=2, mirror_views=True, **kw))
    assert len(list(read(data, state=mirrored, views=2, mirror_views=True, **kw))) == whole - 2
