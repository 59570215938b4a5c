"""Elastic resume (issue 21): a read saved with N workers resumes with M, and the epochs
in progress still read every example exactly once; later epochs are the M-worker order.

The oracle is plain Python over uninterrupted reads: each old worker's stream as the
N-worker reader yields it, its tail cut at the save, the tails merged round-robin and
dealt to the new workers (docs/design.md, "Elastic resume")."""

from __future__ import annotations

import contextlib
import functools
import json

import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.torch import TorchReader

B = 8
EPOCHS = 3
OPTS = dict(seed=3, shuffle_buffer=16, cycle_length=4, block_length=2, decode=False)


@pytest.fixture(scope="module")
def data_240(tmp_path_factory):
    """240 examples in 60 shards (a multiple of 1..5 workers), and 240 in 7 (unequal)."""
    root = tmp_path_factory.mktemp("elastic") / "images"
    synthetic.make_image_folder(str(root), num_labels=4, per_label=60, formats=("png",))
    out = tmp_path_factory.mktemp("elastic_out")
    write_dataset(str(root), str(out / "even"), "--splits=train=1.0", "--num_shards=60")
    write_dataset(str(root), str(out / "uneven"), "--splits=train=1.0", "--num_shards=7")
    return str(out / "even"), str(out / "uneven")


def keys(ds) -> list[str]:
    return [k.decode() for b in ds for k in b["key"].numpy()]


@functools.cache
def streams(data_dir: str, workers: int, start_epoch: int = 0) -> list[list[str]]:
    """Every worker's uninterrupted stream of keys, all epochs (from ``start_epoch``):
    read once a module, as several tests' oracle (not to be changed by a caller)."""
    return [
        keys(
            reader.make_dataset(
                data_dir,
                "train",
                B,
                num_workers=workers,
                worker_index=w,
                epochs=EPOCHS,
                start_epoch=start_epoch,
                **OPTS,
            )
        )
        for w in range(workers)
    ]


def leads(old: list[list[str]], consumed: int, per_epoch: list[int], new: int):
    """The oracle: what each of ``new`` workers reads first after ``old`` workers each
    consumed ``consumed`` records (tails to the end of the last epoch any had started,
    merged round-robin, dealt)."""
    top = max(consumed // n for n in per_epoch)
    tails = [s[consumed : (top + 1) * n] for s, n in zip(old, per_epoch)]
    merged = [t[i] for i in range(max(map(len, tails))) for t in tails if i < len(t)]
    return [merged[j::new] for j in range(new)], top


def resumed(data_dir: str, state, workers: int) -> list[tuple[list[str], reader.ReadState]]:
    options = reader.ReadOptions(epochs=EPOCHS, **OPTS)
    out = []
    for j in range(workers):
        ds, new = reader.resume(
            data_dir, "train", state, options, num_workers=workers, worker_index=j
        )
        out.append((keys(ds), new))
    return out


# grows (2 -> 3, and 1 -> 2 below) and shrinks (3 -> 2), each dealing the tails unevenly,
# and shrinks to one worker (4 -> 1: 60 records a worker, an epoch ending in a partial batch).
# Growing from one worker to four is in test_torch_reader_state_dict_resumes_elastically.
CASES = [(2, 3), (3, 2), (4, 1)]


@pytest.mark.parametrize("old_n, new_n", CASES)
def test_every_example_once_across_old_and_new_workers(data_240, old_n, new_n):
    _check_elastic(data_240[0], old_n, new_n)


@contextlib.contextmanager
def _small_chunks():
    from reader.records import stream

    with pytest.MonkeyPatch.context() as m:
        m.setattr(stream, "CHUNK", 4)
        yield


def test_the_lead_is_fetched_in_parallel_chunks_safely(data_240):
    """tf.data runs the lead's fetches in parallel (its map parallelization): with
    chunks of 4 records, many at once, each must use descriptors of its own. (The
    resumed reads run with 4-record chunks; the oracle's plain reads are shared.)"""
    _check_elastic(data_240[0], 1, 2, during=_small_chunks)


def _check_elastic(data_dir: str, old_n: int, new_n: int, during=contextlib.nullcontext) -> None:
    old = streams(data_dir, old_n)
    n = len(old[0]) // EPOCHS  # equal counts: 240 / workers
    plain = {}  # the new workers' own streams from an epoch on, by that epoch
    # mid-shard, the last partial batch of an epoch, its exact end, inside the next epoch
    for step in (3, n // B, -(-n // B) if n % B else n // B + 1, n // B + 2):
        consumed = step * B
        state = reader.ReadState(seed=3, batch_size=B, step=step, num_workers=old_n)
        want, top = leads(old, consumed, [n] * old_n, new_n)
        with during():
            got = resumed(data_dir, state, new_n)
        read_before = [k for s in old for k in s[top * n : consumed]]
        read_after = []
        for j, (stream, new) in enumerate(got):
            assert stream[: len(want[j])] == want[j], (step, j)
            read_after += want[j]
            assert (new.epoch, new.step, new.num_workers) == (top + 1, 0, new_n)
        assert sorted(read_before + read_after) == sorted(set(old[0]) | {k for s in old for k in s})
        # then the new workers' own order: what M workers read from that epoch on
        if top not in plain:
            plain[top] = streams(data_dir, new_n, start_epoch=top + 1)
        for j, (stream, _) in enumerate(got):
            assert stream[len(want[j]) :] == plain[top][j]


def test_resizing_again_during_and_after_the_lead(data_240):
    """2 -> 3 workers, 3 -> 2 in the middle of the lead, 2 -> 4 after it: every epoch
    still reads every example once, and the state stays a few integers."""
    data_dir = data_240[0]
    old = streams(data_dir, 2)
    first = reader.ReadState(seed=3, batch_size=B, step=5, num_workers=2)
    three = resumed(data_dir, first, 3)
    lead3 = len(three[0][0]) - len(streams(data_dir, 3, start_epoch=1)[0])
    assert lead3 > 2 * B
    second = three[0][1].advance(2)  # 2 batches of the lead each
    two = resumed(data_dir, second, 2)
    assert two[0][1].elastic == (2, 0, 5 * B, 0, 0, 3 * 2 * B)  # same old position, offset
    epoch0 = [k for s in old for k in s[: 5 * B]] + [k for s, _ in three for k in s[: 2 * B]]
    rest = len(two[0][0]) - len(streams(data_dir, 2, start_epoch=1)[0])
    epoch0 += [k for s, _ in two for k in s[:rest]]
    assert sorted(epoch0) == sorted(set(old[0]) | set(old[1]))
    # after the lead: the 2 workers' own epoch 1, 3 batches in, then 4 workers
    third = two[0][1].advance(-(-rest // B) + 3)
    four = resumed(data_dir, third, 4)
    assert four[0][1].elastic[:3] == (2, 1, third.step * B)
    assert len(json.dumps(json.loads(four[0][1].to_json()))) < 400


def test_unequal_counts_finish_every_started_epoch(data_240):
    """7 shards over 3 workers: counts differ, so at a step workers may be in different
    epochs; every epoch any had started is finished, each record once in it."""
    data_dir = data_240[1]
    old = streams(data_dir, 3)
    per_epoch = [len(s) // EPOCHS for s in old]
    step = min(per_epoch) // B + 1  # the smallest worker is past its epoch end
    want, top = leads(old, step * B, per_epoch, 2)
    state = reader.ReadState(seed=3, batch_size=B, step=step, num_workers=3)
    got = resumed(data_dir, state, 2)
    for j, (stream, _) in enumerate(got):
        assert stream[: len(want[j])] == want[j]
    for epoch in range(top + 1):  # each epoch <= top: once across before and after
        before = [
            k for s, n in zip(old, per_epoch) for k in s[epoch * n : min((epoch + 1) * n, step * B)]
        ]
        after = [
            k for s, n in zip(old, per_epoch) for k in s[max(epoch * n, step * B) : (epoch + 1) * n]
        ]
        assert sorted(before + after) == sorted(k for s, n in zip(old, per_epoch) for k in s[:n])


@functools.cache
def _resumed_keys(data_dir: str, saved: str, new_n: int, j: int) -> list[str]:
    """make_dataset's keys for new worker ``j`` of ``new_n``, resumed from the saved
    state (JSON): read once for the backends that saved the same state (3 -> 2)."""
    state = reader.ReadState.from_json(saved)
    options = reader.ReadOptions(epochs=EPOCHS, **OPTS)
    ds, _ = reader.resume(data_dir, "train", state, options, num_workers=new_n, worker_index=j)
    return keys(ds)


@pytest.mark.parametrize(
    "backend, old_n, new_n", [("dali", 3, 2), ("tf", 3, 2), ("dali", 2, 3), ("dali", 1, 4)]
)
def test_torch_reader_state_dict_resumes_elastically(data_240, backend, old_n, new_n):
    """TorchReader.state_dict() after 4 batches on N ranks, load_state_dict() on M: the
    epoch reads every example once, and each backend reads what make_dataset reads."""
    data_dir = data_240[0]
    kw = dict(image_size=(8, 8), backend=backend, epochs=EPOCHS, **{**OPTS, "decode": True})
    seen = []
    saved = None
    for w in range(old_n):
        r = TorchReader(data_dir, "train", B, num_workers=old_n, worker_index=w, **kw)
        for i, batch in enumerate(r):
            seen += batch["key"]
            if i == 3:
                break
        saved = r.state_dict() if saved is None else saved
        assert r.state_dict() == saved  # every rank stands at the same place
    assert reader.ReadState.from_json(saved["read_state"]).step == 4
    for j in range(new_n):
        r = TorchReader(data_dir, "train", B, num_workers=new_n, worker_index=j, **kw)
        r.load_state_dict(saved)
        want = _resumed_keys(data_dir, saved["read_state"], new_n, j)
        got = [k for b in r for k in b["key"]]
        assert got == want
        after = streams(data_dir, new_n, start_epoch=1)[j]  # the new workers' own epoch 1 on
        seen += got[: len(want) - len(after)]
    assert len(seen) == len(set(seen)) == 240


def test_gzip_shards_refuse_another_worker_count(tmp_path):
    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=10, formats=("png",))
    out = str(tmp_path / "gz")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4", "--compression=gzip")
    state = reader.ReadState(seed=3, batch_size=2, step=1, num_workers=2)
    with pytest.raises(reader.DatasetError, match="convert without --compression"):
        reader.resume(
            out, "train", state, reader.ReadOptions(**OPTS), num_workers=1, worker_index=0
        )
    ds, _ = reader.resume(
        out, "train", state, reader.ReadOptions(**OPTS), num_workers=2, worker_index=0
    )
    assert len(keys(ds)) == 10 - 2


def _real_keys(ds, pad: bool) -> list[str]:
    out = []
    for b in ds:
        mask = b["mask"].numpy() if pad else [True] * len(b["key"])
        out += [k.decode() for k, m in zip(b["key"].numpy(), mask) if m]
    return out


@functools.cache
def _ended_read(data_dir: str, pad: bool):
    """The 2 workers' one-epoch read (real keys) and its state 2 batches after the smaller
    worker's last: read once for the 3 new worker counts."""
    opts = dict(OPTS, shuffle=False, epochs=1, pad_final_batch=pad)
    old = [
        _real_keys(
            reader.make_dataset(data_dir, "train", B, num_workers=2, worker_index=w, **opts), pad
        )
        for w in range(2)
    ]
    small = min(len(s) for s in old)
    step = -(-small // B) + 2  # the smaller worker finished 2 batches ago
    _, state = reader.make_dataset(
        data_dir, "train", B, state=reader.ReadState(3, B), num_workers=2, worker_index=0, **opts
    )
    return opts, old, step, state.advance(step)


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("new_n", [1, 2, 3])
def test_a_worker_whose_read_has_ended_is_done_not_in_its_next_epoch(data_240, pad, new_n):
    """Issue 27.6: 7 unequal shards, 2 workers, one epoch; saved after the smaller worker's
    last real batch (padding, or waiting for the other). Resumed by 1, 2 or 3 workers,
    every example is read once in all, and none twice (185 were, counted into epoch 1)."""
    data_dir = data_240[1]
    opts, old, step, state = _ended_read(data_dir, pad)
    assert step * B < max(len(s) for s in old)
    before = [k for s in old for k in s[: step * B]]
    after = []
    for j in range(new_n):
        ds, _ = reader.resume(
            data_dir, "train", state, reader.ReadOptions(**opts), num_workers=new_n, worker_index=j
        )
        after += _real_keys(ds, pad)
    assert len(before + after) == len(set(before + after)) == 240
