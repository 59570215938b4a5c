"""Issue 45.2: a state that skips steps (``ReadState.skip``): the batches of the steps
named are not yielded, on every face, and nothing else moves: the batches before and
after them are the uninterrupted read's, the state counts on past them, an elastic
resume and a mix keep them, ``explain`` says the same."""

from __future__ import annotations

import functools
import json
import logging

import pytest
from controls_data import controls_dataset, keys, same, saved_after

import reader
from reader.explain import explain
from reader.values.state import ReadState

OPTS = dict(image_size=(8, 8), seed=4, shuffle_buffer=16, cycle_length=4, epochs=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """72 images: train (4 shards: 3 workers read unequal counts) and val."""
    return controls_dataset(tmp_path_factory)


def tf_keys(data, split, batch_size, state, **kw):
    ds, _ = reader.make_dataset(data, split, batch_size, state=state, **kw)
    return keys({k: v.numpy() for k, v in b.items()} for b in ds)


@functools.cache
def _plain_train(data, state_json: str, num_workers: int, worker_index: int):
    """tf.data's keys of "train" (OPTS) from a state without skips or exclusions: the
    reference two tests compare with, read once a module (a tuple: not to be changed)."""
    state = ReadState.from_json(state_json)
    kw = dict(OPTS, num_workers=num_workers, worker_index=worker_index)
    return tuple(tf_keys(data, "train", 4, state, **kw))


def plain_train(data, state: ReadState, num_workers: int, worker_index: int) -> list:
    return list(_plain_train(data, state.to_json(), num_workers, worker_index))


def numpy(data, state, **kw):
    r = reader.NumpyReader(data, "train", 4, transform=same, num_processes=0, **kw)
    r.load_state_dict({"read_state": state.to_json()})
    return r


@pytest.mark.fast
def test_a_state_s_skips_are_small_ranges_passed_over_as_it_advances():
    s = ReadState(0, 8, step=10).skip(20, 25).skip(24, 30).skip(40, 41)
    assert s.skips == ((20, 30), (40, 41))
    assert s.advance(9).step == 19 and s.advance(10).step == 30 and s.advance(11).step == 31
    assert s.advance(20).step == 41 and s.advance(20).skips is None
    assert s.skip(5, 12).step == 12  # a skip over the next batch moves to its stop
    assert ReadState.from_json(s.to_json()) == s and len(s.to_json()) < 200
    assert "skips" not in ReadState(0, 8).to_json()  # as saved before skips
    for bad in ([[5, 5]], [[3]], [[True, 4]], "1:2"):
        with pytest.raises(ValueError, match="skips must be") as e:
            ReadState(0, 8, skips=bad)
        assert "\n" not in str(e.value)


def test_skipped_steps_are_exactly_the_ones_named_on_every_face(data):
    """Saved at step 2, steps 4 and 5 skipped: tf.data, TorchReader (tf) and NumpyReader
    yield the uninterrupted read's batches 2, 3, 6, 7, ...; the state after 3 batches is
    step 7 (resumed from it: batches 7 on); explain says the same."""
    kw = dict(OPTS, num_workers=3, worker_index=1)
    start = ReadState(4, 4)
    whole = plain_train(data, start, 3, 1)
    saved = start.advance(2)
    skipping = saved.skip(4, 6)
    want = whole[2:4] + whole[6:]
    assert tf_keys(data, "train", 4, skipping, **kw) == want
    torch = reader.TorchReader(data, "train", 4, backend="tf", state=skipping, **kw)
    assert keys(list(torch)) == want and len(torch) == len(want)
    r = numpy(data, skipping, **kw)
    assert keys(list(r)) == want and len(r) == len(want)
    # explain numbers steps as the state counts them: 4 and 5 are left out, no batch
    said = explain(data, "train", 4, range(2, 4 + len(want)), state=skipping, **kw)
    assert [s["key"] for s in said] == want
    assert [s["step"] for s in said] == [2, 3, *range(6, 4 + len(want))]
    later = ReadState.from_json(saved_after(r, 3)["read_state"])
    assert later.step == 7 and later.skips is None
    assert keys(list(numpy(data, later, **kw))) == whole[7:]
    with pytest.raises(ValueError, match="views spread") as e:
        numpy(data, skipping, views=2, view_spread=1, **kw)
    assert "\n" not in str(e.value)


def test_skips_survive_an_elastic_resume_and_a_mix(data):
    """Saved by 3 workers at step 2 with steps 4 and 5 skipped, resumed by 2: each worker
    yields its resumed read but its 3rd and 4th batches. A mix skips its own steps."""
    kw = dict(OPTS)
    saved = ReadState(4, 4, step=2, num_workers=3)
    for j in range(2):
        two = dict(kw, num_workers=2, worker_index=j)
        plain = plain_train(data, saved, 2, j)
        assert tf_keys(data, "train", 4, saved.skip(4, 6), **two) == plain[:2] + plain[4:]
        r = numpy(data, saved.skip(4, 6), **two)
        assert keys(list(r)) == plain[:2] + plain[4:]
        moved = ReadState.from_json(r.state_dict()["read_state"])
        assert moved.skips is None  # passed
    mix = reader.mix([((data, "train"), 3), ((data, "val"), 1)])
    state = ReadState(4, 4, step=1)
    plain = tf_keys(mix, None, 4, state, **kw)
    assert tf_keys(mix, None, 4, state.skip(2, 4), **kw) == plain[:1] + plain[3:]
    said = explain(mix, None, 4, range(1, 6), state=state.skip(2, 4).to_json(), **kw)
    assert [s["key"] for s in said] == plain[:1] + plain[3:5]
    assert [s["step"] for s in said] == [1, 4, 5]
    with pytest.raises(ValueError, match="pad_final_batch is for evaluation"):
        reader.make_dataset(
            data,
            "val",
            4,
            state=ReadState(4, 4).skip(1, 2),
            image_size=(8, 8),
            shuffle=False,
            pad_final_batch=True,
        )
    assert json.loads(saved.skip(4, 6).to_json())["skips"] == [[4, 6]]


def test_excluded_keys_never_appear_again_and_the_rest_is_read_once(data):
    """Keys excluded from a state at step 2: on tf.data, TorchReader (tf), NumpyReader and
    explain, their rows come as padding rows (mask False, key "", image zeros), in every
    epoch, after 3 -> 2 workers too; everything else is the read without them. An
    evaluation with pad_final_batch reads every other key exactly once."""
    kw = dict(OPTS, num_workers=3, worker_index=1)
    start = ReadState(4, 4)
    whole = plain_train(data, start, 3, 1)
    out = {whole[3][1], whole[5][0], whole[0][2]}  # one of them read before the state
    state = start.advance(2).exclude(sorted(out))
    want = [[k if k not in out else "" for k in b] for b in whole[2:]]
    ds, _ = reader.make_dataset(data, "train", 4, state=state, **kw)
    got = [{k: v.numpy() for k, v in b.items()} for b in ds]
    assert keys(got) == want
    for b, w in zip(got, want):
        assert list(b["mask"]) == [k != "" for k in w]
        assert not b["image"][~b["mask"]].any() and not b["label"][~b["mask"]].any()
    torch = reader.TorchReader(data, "train", 4, backend="tf", state=state, **kw)
    assert keys(list(torch)) == want
    py = list(numpy(data, state, **kw))
    assert keys(py) == want and [list(b["mask"]) for b in py] == [list(b["mask"]) for b in got]
    said = explain(data, "train", 4, range(2, 2 + len(want)), state=state, **kw)
    assert [s["key"] for s in said] == want
    met = sum(k in out for b in whole[2:] for k in b)  # each epoch's
    assert sum(int(s["excluded"].sum()) for s in said) == met >= 2
    assert ReadState.from_json(state.to_json()).excluded == tuple(sorted(out))
    for j in range(2):  # elastic: the exclusion goes with the state
        two = dict(OPTS, num_workers=2, worker_index=j)
        moved = ReadState(4, 4, step=2, num_workers=3)
        plain = plain_train(data, moved, 2, j)
        assert tf_keys(data, "train", 4, moved.exclude(sorted(out)), **two) == [
            [k if k not in out else "" for k in b] for b in plain
        ]
    val = reader.load_info(data).split("val").num_examples
    every = tf_keys(
        data, "val", 5, ReadState(0, 5), image_size=(8, 8), shuffle=False, pad_final_batch=True
    )
    gone = {every[0][1], every[-1][0]}
    read = tf_keys(
        data,
        "val",
        5,
        ReadState(0, 5).exclude(sorted(gone)),
        image_size=(8, 8),
        shuffle=False,
        pad_final_batch=True,
    )
    seen = [k for b in read for k in b if k]
    assert len(seen) == len(set(seen)) == val - 2 and not set(seen) & gone
    with pytest.raises(ValueError, match="list of keys") as e:
        ReadState(0, 4, excluded="a/b.png")
    assert "\n" not in str(e.value)


def test_excluded_keys_the_split_does_not_hold_are_named_once_on_every_face(data, caplog):
    """A typo in a takedown list excluded nothing, silently. Keys no shard of the split
    holds are named in one warning (five of them, and the count), once a process for a
    read's keys, on every face: the read is resolved in one place below them all."""
    held = plain_train(data, ReadState(4, 4), 1, 0)[0][0]

    def said(read, face: str) -> list[str]:
        typos = [f"{face}/{i}.png" for i in range(7)]
        state = ReadState(4, 4).exclude([held, *typos])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reader"):
            read(state)
            read(state)  # the same keys again: said once
        shown = ", ".join(repr(k) for k in typos[:5])
        assert [r.getMessage() for r in caplog.records] == [
            f"excluded keys in no shard of split 'train' of {data} (7; they exclude "
            f"nothing): {shown} and 2 more; check them against the dataset's keys"
        ]

    said(lambda state: tf_keys(data, "train", 4, state, **OPTS), "tf.data")
    said(lambda state: list(numpy(data, state, **OPTS)), "numpy")
    said(lambda state: explain(data, "train", 4, range(2), state=state, **OPTS), "explain")
    # a split past the bound is not searched: every start of every process would wait
    import reader.front.excluded_keys

    state = ReadState(4, 4).exclude(["past/the/bound.png"])
    caplog.clear()
    with (
        pytest.MonkeyPatch.context() as mp,
        caplog.at_level(logging.WARNING, logger="reader"),
    ):
        mp.setattr(reader.front.excluded_keys, "EXCLUDED_CHECKED_MOST", 3)
        list(numpy(data, state, **OPTS))
    assert caplog.records == []
