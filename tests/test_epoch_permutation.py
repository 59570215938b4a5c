"""A new order every epoch (issue 54): where records are fetched by place (local,
uncompressed shards) a shuffled epoch is one seeded permutation of a worker's
records, so two records that share a batch in one epoch share one in the next no more
often than under an independent shuffle; the runs and windows (a bucket's order) made
records written close stay close, at about 5x that."""

from __future__ import annotations

import numpy as np
import pytest

from reader.order.deal import worker_plan


def _repeat_ratio(plan, batch: int) -> float:
    """Pairs that share a batch in epoch 0 and again in epoch 1, over the share an
    independent shuffle gives: (B - 1) / (N - 1) of them."""
    n = plan.size
    later = np.full(sum(plan.counts), -1, np.int64)  # (workers sharing shards: ids vary)
    later[plan.epoch_order(1)] = np.arange(n) // batch
    pairs = again = 0
    order = plan.epoch_order(0)
    for start in range(0, n - batch + 1, batch):
        then = later[order[start : start + batch]]
        pairs += batch * (batch - 1) // 2
        again += int(sum(np.sum((then[i + 1 :] == then[i]) & (then[i] >= 0)) for i in range(batch)))
    return again / pairs / ((batch - 1) / (n - 1))


@pytest.mark.parametrize("workers, index", [(1, 0), (2, 1), (4, 2)])
def test_records_meet_again_no_more_often_than_under_an_independent_shuffle(workers, index):
    counts = [1250] * 16  # 20,000 records in 16 shards
    ratios = [
        _repeat_ratio(worker_plan(counts, workers, index, seed, 16, 1, 1000, whole=True), 32)
        for seed in range(4)
    ]
    assert np.mean(ratios) <= 1.2, ratios
    runs = [
        _repeat_ratio(worker_plan(counts, workers, index, seed, 16, 1, 1000), 32)
        for seed in range(2)
    ]
    if workers < 4:  # the runs and windows, what the permutation fixes: 1.4-2.9 here
        assert np.mean(runs) > 1.2, runs


def test_each_epoch_is_a_permutation_and_workers_sharing_shards_split_it():
    counts = [100, 90, 80]
    plans = [worker_plan(counts, 5, w, 7, 16, 1, 50, whole=True) for w in range(5)]
    for epoch in range(3):
        # 5 workers share 3 shards: each takes every 5th record of one permutation
        got = np.concatenate([p.epoch_order(epoch) for p in plans])
        assert sorted(got.tolist()) == list(range(270))
    assert not np.array_equal(plans[0].epoch_order(0), plans[0].epoch_order(1))
    one = worker_plan(counts, 1, 0, 7, 16, 1, 50, whole=True)
    assert sorted(one.epoch_order(2).tolist()) == list(range(270))
    unshuffled = worker_plan(counts, 1, 0, None, 16, 1, 50, whole=True)
    runs = worker_plan(counts, 1, 0, None, 16, 1, 50)  # unshuffled: files interleaved
    assert unshuffled.epoch_order(0).tolist() == runs.epoch_order(0).tolist()


def test_random_access_true_is_refused_where_records_cannot_be_fetched_by_place(tmp_path):
    from dataset_writer import write_dataset

    import reader
    from evenshard import synthetic

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png",))
    out = str(tmp_path / "gz")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2", "--compression=gzip")
    with pytest.raises(ValueError, match=r"random_access=True .* gzip-compressed .* pass"):
        reader.make_dataset(out, "train", 4, seed=0, decode=False, random_access=True)
    got = reader.make_dataset(out, "train", 4, seed=0, decode=False)  # None: runs there
    assert sum(len(b["key"]) for b in got) == 12
    with pytest.raises(TypeError, match="random_access must be True, False or None"):
        reader.make_dataset(out, "train", 4, random_access="yes")


def test_a_state_names_whether_it_was_read_by_place(tmp_path):
    """A state saved reading by place resumes only by place (the runs would read some
    records twice, others never), whatever the runs' options; one saved by runs (as
    every state before random access) resumes with random_access=False."""
    from dataset_writer import write_dataset

    import reader
    from evenshard import synthetic

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=12, formats=("png",))
    out = str(tmp_path / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    opts = dict(seed=4, decode=False, epochs=2)
    whole = [k for b in reader.make_dataset(out, "train", 4, **opts) for k in b["key"].numpy()]
    state = reader.ReadState(seed=4, batch_size=4, epoch=0, step=3)
    ds, saved = reader.resume(out, "train", state, **opts)
    assert [k for b in ds for k in b["key"].numpy()] == whole[12:]
    with pytest.raises(ValueError, match="saved reading local shards by place .* left at None"):
        reader.resume(out, "train", saved, **opts, random_access=False)
    ds, _ = reader.resume(out, "train", saved, **opts, cycle_length=3)  # shapes no permutation
    assert [k for b in ds for k in b["key"].numpy()] == whole[12:]
    runs = dict(opts, random_access=False)
    by_runs = [k for b in reader.make_dataset(out, "train", 4, **runs) for k in b["key"].numpy()]
    assert by_runs != whole and sorted(by_runs) == sorted(whole)
    _, saved = reader.resume(out, "train", state, **runs)
    with pytest.raises(
        ValueError,
        match=r"in runs and windows .* pass random_access=False \(--no_random_access\) to",
    ):
        reader.resume(out, "train", saved, **opts)
    ds, _ = reader.resume(out, "train", saved, **runs)
    assert [k for b in ds for k in b["key"].numpy()] == by_runs[12:]


def test_setting_the_windows_options_for_a_read_by_place_is_said_once(
    tmp_path, caplog, monkeypatch
):
    """shuffle_buffer, cycle_length and block_length shape the runs and windows only:
    set for a local read by place, which they do not change, one warning says so
    (a new user's make_dataset(shuffle_buffer=16) gave the default order silently)."""
    from dataset_writer import write_dataset

    import reader
    from evenshard import synthetic
    from reader.front import share

    # once a process: a test of this process may have been told already
    monkeypatch.setattr(share, "_SAID_UNSHAPED", set())

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=6, formats=("png",))
    out = str(tmp_path / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    with caplog.at_level("WARNING"):
        for _ in range(2):
            reader.make_dataset(out, "train", 4, seed=0, decode=False, shuffle_buffer=16)
        reader.make_dataset(
            out, "train", 4, seed=0, decode=False, shuffle_buffer=16, random_access=False
        )
    said = [r.message for r in caplog.records if "shape the runs and windows" in r.message]
    assert len(said) == 1 and said[0].startswith("shuffle_buffer shape"), said
