"""Issue 45's test list on the faces the first tests left out: ``explain`` equals every
batch of every face from the start, after a resume, after 3 -> 2 workers and with a mix;
skipped steps are exactly the ones named on TorchReader (python, dali) and
make_dali_pipeline; excluded keys never come again and the rest is read exactly once on
every face (``pad_final_batch``, 2 workers); with ``make_dataset``'s ``as_supervised`` their
rows weigh 0; ``explain`` refuses gzip shards (README, "Which data was in step s").

The cells already tested elsewhere are left out here: from the start, tf.data,
TorchReader (tf) and NumpyReader (test_explain.py::test_explain_equals_every_batch_of_
each_face); NumpyReader resumed and after 3 -> 2 (test_explain_after_a_resume_and_after_
3_to_2_workers); tf.data's mix and NumpyReader's views spread (test_explain_a_mix_and_
views_spread: views spread are the Python route's alone); skips on tf.data, TorchReader
(tf) and NumpyReader (test_skip.py).
"""

from __future__ import annotations

import functools

import pytest
from controls_data import FACES, controls_dataset, read_face, same, saved_after
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.explain import explain
from reader.values.state import ReadState

OPTS = dict(image_size=(8, 8), seed=4, shuffle_buffer=16, cycle_length=4, epochs=2)

# scenario -> the faces it is tested on here (the others: see the module docstring)
UNTESTED = {
    "start": ("torch-python", "torch-dali", "dali"),
    "resume": ("tf.data", "torch-tf", "torch-python", "torch-dali", "dali"),
    "3->2": ("tf.data", "torch-tf", "torch-python", "torch-dali", "dali"),
    "mix": ("numpy", "torch-tf", "torch-python", "torch-dali", "dali"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return controls_dataset(tmp_path_factory)


def scenario_reads(name: str, data) -> list[tuple]:
    """(data, split, state, first step, options) of each read of a scenario."""
    if name == "start":
        return [(data, "train", None, 0, dict(OPTS, num_workers=3, worker_index=1))]
    if name == "resume":
        saved = ReadState(4, 4, step=3, num_workers=3)
        return [(data, "train", saved, 3, dict(OPTS, num_workers=3, worker_index=1))]
    if name == "3->2":
        saved = ReadState(4, 4, step=3, num_workers=3)
        return [
            (data, "train", saved, 3, dict(OPTS, num_workers=2, worker_index=j)) for j in (0, 1)
        ]
    mix = reader.mix([((data, "train"), 3), ((data, "val"), 1)])
    return [(mix, None, None, 0, OPTS), (mix, None, ReadState(4, 4, step=2), 2, OPTS)]


@pytest.mark.parametrize("scenario", sorted(UNTESTED))
def test_explain_equals_every_step_of_every_face(data, scenario):
    """The keys ``explain`` gives for each step are those each face yields, and the masks
    and epochs where the face gives them."""
    for source, split, state, first, kw in scenario_reads(scenario, data):
        for face in UNTESTED[scenario]:
            got = read_face(face, source, split, 4, state=state, **kw)
            said = explain(source, split, 4, range(first, first + len(got)), state=state, **kw)
            assert len(got) >= 4, (face, len(got))
            assert [b["key"] for b in got] == [s["key"] for s in said], face
            for field in ("mask", "epoch"):  # where the face gives them (tf.data: no mask)
                if field in got[0]:
                    assert [list(b[field]) for b in got] == [list(s[field]) for s in said]
            with pytest.raises(ValueError, match="past the end of the read"):
                explain(source, split, 4, [first + len(got)], state=state, **kw)


@pytest.mark.parametrize("face", ["torch-python", "torch-dali", "dali"])
def test_skipped_steps_are_exactly_the_ones_named_on_the_other_faces(data, face):
    """Saved at step 2 with steps 4 and 5 skipped: the uninterrupted read's batches 2, 3,
    6, 7, ... (keys and masks), alone and after 3 -> 2 workers; a mix skips its own."""
    for saved, kw in (
        (ReadState(4, 4, step=2), dict(OPTS, num_workers=3, worker_index=1)),
        (ReadState(4, 4, step=2, num_workers=3), dict(OPTS, num_workers=2, worker_index=1)),
    ):
        whole = read_face(face, data, "train", 4, state=saved, **kw)
        got = read_face(face, data, "train", 4, state=saved.skip(4, 6), **kw)
        want = whole[:2] + whole[4:]
        assert [b["key"] for b in got] == [b["key"] for b in want]
        assert all((b["mask"] == w["mask"]).all() for b, w in zip(got, want))
    mix = reader.mix([((data, "train"), 3), ((data, "val"), 1)])
    whole = read_face(face, mix, None, 4, state=ReadState(4, 4, step=1), **OPTS)
    got = read_face(face, mix, None, 4, state=ReadState(4, 4, step=1).skip(2, 4), **OPTS)
    assert [b["key"] for b in got] == [b["key"] for b in whole[:1] + whole[3:]]


@pytest.mark.parametrize("face", FACES)
def test_excluded_keys_never_come_and_the_rest_is_read_once_on_every_face(data, face):
    """An evaluation of val by 2 workers with pad_final_batch, 3 keys excluded: each other
    key exactly once over both workers, the excluded ones never, their rows padding rows
    (mask False, key "", label 0; image zeros where the face decodes padding itself:
    tf.data and DALI), both workers the same batch count."""
    kw = dict(image_size=(8, 8), shuffle=False, pad_final_batch=True)
    every = list(_every_val_key(data))  # tf.data's evaluation, the faces' common reference
    gone = sorted(every[1::7][:3])
    state = ReadState(0, 5).exclude(gone)
    reads = [evaluation(face, data, state, j, **kw) for j in (0, 1)]
    assert len(reads[0]) == len(reads[1])
    seen = [k for batches in reads for b in batches for k in b["key"] if k]
    assert sorted(seen) == sorted(set(every) - set(gone)) and len(seen) == len(every) - 3
    rows = [(b, i) for batches in reads for b in batches for i in range(len(b["key"]))]
    masked = [(b, i) for b, i in rows if not b["mask"][i]]
    assert all(b["key"][i] == "" and b["label"][i] == 0 for b, i in masked)
    assert sum(b["mask"].sum() for b, _ in {id(b): (b, 0) for b, _ in rows}.values()) == len(seen)
    if face in ("tf.data", "torch-tf", "dali", "torch-dali"):
        assert all(not b["image"][i].any() for b, i in masked)


@functools.cache
def _every_val_key(data) -> tuple[str, ...]:
    """The real keys of val's evaluation by 2 workers on tf.data (no state), in order:
    read once a module for the 6 faces (each face's read with the exclusions is then
    held to every key of val but the excluded, once)."""
    kw = dict(image_size=(8, 8), shuffle=False, pad_final_batch=True)
    every = [
        k for j in (0, 1) for b in evaluation("tf.data", data, None, j, **kw) for k in b["key"]
    ]
    return tuple(k for k in every if k)


def evaluation(face, data, state, worker: int, **kw) -> list[dict]:
    if state is None:
        state = ReadState(0, 5)
    return read_face(face, data, "val", 5, state=state, num_workers=2, worker_index=worker, **kw)


def test_excluded_rows_weigh_0_with_make_dataset_s_as_supervised(data):
    """as_supervised with a state's excluded keys: (image, label, weight), weight 0 on the
    excluded rows alone, their images zeros."""
    whole = read_face("tf.data", data, "train", 4, state=ReadState(4, 4), **OPTS)
    gone = [whole[0]["key"][1], whole[2]["key"][3]]
    ds, _ = reader.resume(data, "train", ReadState(4, 4).exclude(gone), as_supervised=True, **OPTS)
    weights = [(w.numpy(), i.numpy()) for i, _, w in ds]
    want = [[0.0 if k in gone else 1.0 for k in b["key"]] for b in whole]
    assert [list(w) for w, _ in weights] == want and sum(w.count(0.0) for w in want) == 4
    assert all(not i[w == 0].any() for w, i in weights)


def test_explain_refuses_gzip_shards_in_one_line(tmp_path):
    """explain reads the keys by the DALI index, which gzip shards have not."""
    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=4, formats=("png",))
    write_dataset(str(root), str(tmp_path / "ds"), "--splits=train=1.0", "--compression=gzip")
    with pytest.raises(reader.DatasetError, match="gzip") as e:
        explain(str(tmp_path / "ds"), "train", 4, [0], seed=0)
    assert "\n" not in str(e.value)


def test_explain_refuses_views_spread_handed_over_to_2_workers(data):
    """Views spread, saved by 3 workers: a spread state has an image with a view still to
    go after every batch but the read's ends (view_skip > 0), which 2 workers then hand
    over (reader/routes/view_handover.py); explain does not follow it, in one line. (Spread
    views from a state with the same worker count: test_explain.py.)"""
    kw = dict(OPTS, views=2, view_spread=2)
    r = numpy(data, num_workers=3, worker_index=1, **kw)
    state = saved_after(r, 3)
    assert state["view_skip"] > 0
    explain(
        data, "train", 4, [6 + state["view_skip"]], state=state, num_workers=3, worker_index=1, **kw
    )
    with pytest.raises(ValueError, match="elastic handover of views") as e:
        explain(data, "train", 4, [6], state=state, num_workers=2, worker_index=0, **kw)
    assert "\n" not in str(e.value)


def numpy(data, **kw):
    """A NumpyReader (to save a state from)."""
    return reader.NumpyReader(data, "train", 4, transform=same, num_processes=0, **kw)
