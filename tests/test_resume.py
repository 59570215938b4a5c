"""Resuming a read mid-epoch (issue 13): the resumed stream is the tail of the uninterrupted one."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from conftest import read_split
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.order.deal import deal
from reader.order.plan import ReadPlan

BATCH = 16
OPTS = dict(seed=11, shuffle_buffer=24, cycle_length=4, block_length=2, decode=False)


@pytest.fixture(scope="module")
def data_241(tmp_path_factory):
    """241 examples in "train": 6 shards of 41 or 40; and "eval", unshuffled by default;
    and the images' folder."""
    root = tmp_path_factory.mktemp("resume") / "images"
    synthetic.make_image_folder(str(root), num_labels=4, per_label=60, formats=("jpeg", "png"))
    (root / "label_0" / "extra.png").write_bytes(
        synthetic.image_bytes("png", 20, 20, np.random.default_rng(1))
    )
    out = str(tmp_path_factory.mktemp("resume_out"))
    write_dataset(str(root), out, "--splits=train=0.5,eval=0.5", "--split_mode=exact")
    write_dataset(str(root), out + "/all", "--splits=train=1.0", "--num_shards=6")
    return out + "/all", out, str(root)


@pytest.fixture(scope="module")
def stored_keys(data_241) -> list[bytes]:
    """The keys of "train" as stored, shard after shard (read once for the module)."""
    return [r["image/key"] for shard in read_split(data_241[0], "train") for r in shard]


@pytest.fixture(scope="module")
def uninterrupted(data_241):
    """``uninterrupted(workers, w, drop_remainder)``: that worker's batches of 2 epochs
    of "train", read once for the module (each test that compares with it)."""
    made = {}

    def whole(workers: int, w: int, drop_remainder: bool) -> list[dict]:
        if (workers, w, drop_remainder) not in made:
            common = dict(
                OPTS, epochs=2, num_workers=workers, worker_index=w, drop_remainder=drop_remainder
            )
            made[workers, w, drop_remainder] = batches(
                reader.make_dataset(data_241[0], "train", BATCH, **common)
            )
        return made[workers, w, drop_remainder]

    return whole


def batches(ds):
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


def flat_keys(bs) -> list[bytes]:
    return [k for b in bs for k in b["key"]]


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_the_reader_reads_in_the_plans_order(data_241, stored_keys, workers):
    """The tf.data pipeline and reader.plan agree record for record (8 workers share 6 files)."""
    data_dir = data_241[0]
    stored = stored_keys
    info = reader.load_info(data_dir)
    shards = info.split("train").shards
    first = dict(zip([s.file for s in shards], np.cumsum([0] + [s.num_examples for s in shards])))
    for w in range(workers):
        files, _, stride = deal([s.num_examples for s in shards], workers, w)
        mine = [shards[f] for f in files]
        # the plan numbers the worker's records over its own files, in stored order
        ids = [i for s in mine for i in range(first[s.file], first[s.file] + s.num_examples)]
        plan = ReadPlan(
            counts=[s.num_examples for s in mine],
            seed=11,
            cycle=4,
            block=2,
            window=24,
            stride=stride,
            offset=w if stride > 1 else 0,
            parts=-(-4 // len(mine)),  # fewer files than cycle_length: more runs a file
            whole=True,  # local shards with an index: one permutation an epoch
        )
        ds = reader.make_dataset(
            data_dir, "train", None, epochs=2, num_workers=workers, worker_index=w, **OPTS
        )
        expected = [stored[ids[i]] for e in range(2) for i in plan.epoch_order(e)]
        assert [b["key"] for b in batches(ds)] == expected


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_resumed_reads_are_the_tail_of_the_uninterrupted_one(
    data_241, uninterrupted, workers, drop_remainder
):
    data_dir = data_241[0]
    for w in range(workers):
        common = dict(
            OPTS, epochs=2, num_workers=workers, worker_index=w, drop_remainder=drop_remainder
        )
        whole = uninterrupted(workers, w, drop_remainder)
        n = len(whole)
        # 0; mid-shard; a group's end; across the epoch boundary; in the second
        # epoch; the last (partial) batch; the very end
        starts = {0, 1, 5, 10, n // 2, n // 2 + 1, n - 1, n}
        if drop_remainder:
            # it changes how many batches are left (the last one dropped), not where a
            # start lands (drop_remainder=False resumes at each of those): from the
            # start, in the second epoch, at the last batch, at the very end
            starts = {0, n // 2 + 1, n - 1, n}
        for k in sorted(starts):
            ds = reader.make_dataset(data_dir, "train", BATCH, start_step=k, **common)
            assert ds.cardinality().numpy() == n - k
            tail = batches(ds)
            assert len(tail) == n - k
            for got, want in zip(tail, whole[k:]):
                assert list(got["key"]) == list(want["key"]), (w, k)


def test_endless_reads_resume_too(data_241):
    common = dict(OPTS, epochs=None)
    whole = flat_keys(batches(reader.make_dataset(data_241[0], "train", BATCH, **common).take(40)))
    ds = reader.make_dataset(data_241[0], "train", BATCH, start_step=33, **common)
    assert ds.cardinality().numpy() == -1  # infinite
    assert flat_keys(batches(ds.take(7))) == whole[33 * BATCH :]


def test_resumed_crops_and_images_are_the_same(data_241):
    common = dict(OPTS, decode=True, image_size=(12, 12), random_crop=True, epochs=2)
    whole = batches(reader.make_dataset(data_241[0], "train", BATCH, **common))
    tail = batches(reader.make_dataset(data_241[0], "train", BATCH, start_step=17, **common))
    for got, want in zip(tail, whole[17:]):
        np.testing.assert_array_equal(got["image"], want["image"])
        np.testing.assert_array_equal(got["label"], want["label"])
    # crops are new every epoch: the same key's two crops differ somewhere
    by_key = collections.defaultdict(list)
    for b in whole:
        for k, image in zip(b["key"], b["image"]):
            by_key[k].append(image)
    assert any(not np.array_equal(*two) for two in by_key.values() if len(two) == 2)


@pytest.mark.parametrize("workers", [1, 3])
def test_padded_evaluation_resumes_with_the_same_masks(data_241, workers):
    data_dir = data_241[1]
    n_eval = reader.load_info(data_dir).split("eval").num_examples
    seen = []
    for w in range(workers):
        common = dict(
            decode=False, pad_final_batch=True, shuffle=False, num_workers=workers, worker_index=w
        )
        whole = batches(reader.make_dataset(data_dir, "eval", 8, **common))
        for k in (0, 3, len(whole) - 1, len(whole)):
            tail = batches(reader.make_dataset(data_dir, "eval", 8, start_step=k, **common))
            assert len(tail) == len(whole) - k
            for got, want in zip(tail, whole[k:]):
                assert list(got["key"]) == list(want["key"])
                assert list(got["mask"]) == list(want["mask"])
        seen += [k for b in whole for k, m in zip(b["key"], b["mask"]) if m]
    assert len(seen) == len(set(seen)) == n_eval


def test_cached_reads_follow_the_same_order(data_241, uninterrupted):
    common = dict(OPTS, epochs=2)
    streamed = flat_keys(uninterrupted(1, 0, False))  # OPTS, 2 epochs, streamed
    cached = reader.make_dataset(data_241[0], "train", BATCH, cache=True, start_step=9, **common)
    assert flat_keys(batches(cached)) == streamed[9 * BATCH :]


def test_a_trainer_saves_and_restores_the_state_as_json(data_241, tmp_path):
    options = reader.ReadOptions(**dict(OPTS, epochs=2))
    ds, state = reader.resume(
        data_241[0], "train", reader.ReadState(seed=11, batch_size=BATCH), options
    )
    whole = flat_keys(batches(ds))
    saved = tmp_path / "read_state.json"
    saved.write_text(state.advance(12).to_json())  # crashed after 12 steps
    # a few integers and two short strings, whatever the images or buffer
    assert len(saved.read_text()) < 300

    state = reader.ReadState.from_json(saved.read_text())
    assert (state.epoch, state.step, state.num_workers) == (0, 12, 1)
    ds, state = reader.resume(data_241[0], "train", state, options)
    assert flat_keys(batches(ds)) == whole[12 * BATCH :]
    with pytest.raises(ValueError, match="seed 11"):
        reader.resume(data_241[0], "train", state, options, seed=12)


def test_resuming_with_another_worker_count_reads_the_epoch_once(data_241):
    # 2 workers read 120/121 each; they stopped after 10 batches (160 records: in epoch 1)
    state = reader.ReadState(11, BATCH, epoch=0, step=10, num_workers=2)
    options = reader.ReadOptions(**dict(OPTS, epochs=3))
    before = [
        k
        for w in range(2)
        for k in flat_keys(
            batches(
                reader.make_dataset(
                    data_241[0],
                    "train",
                    BATCH,
                    num_workers=2,
                    worker_index=w,
                    **dict(OPTS, epochs=3),
                )
            )
        )[: 10 * BATCH]
    ]
    seen = []
    for w in range(3):
        ds, new = reader.resume(data_241[0], "train", state, options, num_workers=3, worker_index=w)
        assert (new.epoch, new.step, new.num_workers) == (2, 0, 3)
        keys = flat_keys(batches(ds))
        own = reader.load_info(data_241[0]).split("train").shards[w::3]
        per_epoch = sum(s.num_examples for s in own)
        assert len(keys) > per_epoch  # the lead, then epoch 2
        seen += keys[: len(keys) - per_epoch]
    # epochs 0 and 1 (both started): every example twice over, never three times
    counts = collections.Counter(before + seen)
    assert len(counts) == 241 and set(counts.values()) == {2}


def test_state_round_trip_and_misuse():
    state = reader.ReadState(seed=3, batch_size=8, epoch=1, step=5, num_workers=2)
    assert reader.ReadState.from_json(state.to_json()) == state
    assert json.loads(state.advance(2).to_json())["step"] == 7
    with pytest.raises(ValueError, match="unknown fields"):
        reader.ReadState.from_json('{"seed": 1, "batch_size": 2, "buffer": []}')
    with pytest.raises(TypeError):
        reader.ReadState(seed="1", batch_size=2)
    elastic = reader.ReadState(seed=3, batch_size=8, num_workers=3, elastic=(2, 0, 40, 0, 0, 8))
    assert reader.ReadState.from_json(elastic.to_json()) == elastic
    with pytest.raises(ValueError, match="6 whole numbers"):
        reader.ReadState(seed=3, batch_size=8, elastic=(2, 0, 40))
    # a state saved by an earlier version (before the split's fingerprint) still loads
    old = '{"seed": 1, "batch_size": 2, "epoch": 0, "step": 3, "num_workers": 2, '
    assert reader.ReadState.from_json(old + '"examples_per_worker": 120}').step == 3


def test_bad_starts_are_refused(data_241):
    with pytest.raises(ValueError, match="past the end"):
        reader.make_dataset(data_241[0], "train", BATCH, start_step=10_000, **OPTS)
    with pytest.raises(ValueError, match="seed of the run"):
        reader.make_dataset(data_241[0], "train", BATCH, start_step=3, decode=False)
    with pytest.raises(ValueError, match="start_step must be|>= 0"):
        reader.ReadOptions(start_step=-1)
