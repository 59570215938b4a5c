"""Weighted mixing (issue 21): reader.mix through every reader, with the same resume.

The oracle is each source read alone: restricted to one source, a mixed stream is
exactly that source's own read (its order, its resume, its elastic lead); the
schedule alone decides the interleaving, and its per-batch proportions track the
weights within one record."""

from __future__ import annotations

import os

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.order.mix import Schedule
from reader.torch import TorchReader

B = 8
OPTS = dict(seed=2, shuffle_buffer=16, cycle_length=4, decode=False)


@pytest.mark.fast
@pytest.mark.parametrize("totals", [(None, None, None), (50, 300, 1000), (7, None, 3)])
def test_the_schedule_is_computable_anywhere_and_tracks_the_weights(totals):
    s = Schedule((0.5, 0.3, 0.2), 7, totals)
    n = 1000 if s.size is None else s.size
    whole = s.choices(0, n)
    assert (np.concatenate([s.choices(a, min(a + 37, n)) for a in range(0, n, 37)]) == whole).all()
    for c in (0, 1, 5, 99, n - 1, n):
        assert (np.bincount(whole[:c], minlength=3) == s.counts(c)).all()
    if s.size is not None:  # every record of every source, once
        assert list(np.bincount(whole, minlength=3)) == list(totals)
    if totals == (None, None, None):
        for start in range(0, n - 64, 64):  # any batch of 64: within one record of the weights
            got = np.bincount(whole[start : start + 64], minlength=3)
            assert (abs(got - 64 * np.array([0.5, 0.3, 0.2])) < 1.0 + 1e-9).all()
    assert not (Schedule((0.5, 0.3, 0.2), 8, totals).choices(0, 200) == whole[:200]).all()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two datasets with the same labels and keys of their own: 240 in 12 shards, 96 in 6."""
    out = []
    for name, per_label, shards in (("a", 60, 12), ("b", 24, 6)):
        root = tmp_path_factory.mktemp(f"mix_{name}") / "images"
        synthetic.make_image_folder(str(root), num_labels=4, per_label=per_label, seed=len(out))
        for label in os.listdir(root):
            for f in os.listdir(root / label):
                os.rename(root / label / f, root / label / f"{name}_{f}")
        out.append(str(tmp_path_factory.mktemp(f"mix_{name}_out") / "out"))
        write_dataset(str(root), out[-1], "--splits=train=1.0", f"--num_shards={shards}")
    return out


def keys(ds) -> list[str]:
    """Keys in read order, of batches or of single examples."""
    return [k.decode() for b in ds for k in np.atleast_1d(b["key"].numpy())]


def only(stream: list[str], name: str) -> list[str]:
    return [k for k in stream if os.path.basename(k).startswith(f"{name}_")]


def test_a_mixed_read_is_each_source_read_alone_interleaved(sources):
    both = reader.mix([(sources[0], 3), (sources[1], 1)])
    ds = reader.make_dataset(both, batch_size=B, epochs=1, **OPTS)
    mixed = keys(ds)
    assert ds.cardinality().numpy() == -(-336 // B)
    assert len(mixed) == len(set(mixed)) == 336  # every record of both, once
    for path, name in zip(sources, "ab"):
        alone = keys(reader.make_dataset(path, "train", None, epochs=1, **OPTS))
        assert only(mixed, name) == alone
    assert keys(reader.make_dataset(both, batch_size=B, epochs=1, **OPTS)) == mixed
    # endless: per batch, b gives a quarter (2 of 8), within one record
    endless = reader.make_dataset(both, batch_size=B, epochs=None, **OPTS).take(60)
    shares = [len(only([k.decode() for k in b["key"].numpy()], "b")) for b in endless]
    assert max(abs(n - B / 4) for n in shares) <= 1


def test_a_mixed_read_resumes_with_the_same_and_another_worker_count(sources):
    both = reader.mix([(sources[0], 0.6), (sources[1], 0.4)])
    options = reader.ReadOptions(epochs=None, **OPTS)
    fresh = reader.ReadState(seed=2, batch_size=B)
    ds, start = reader.make_dataset(both, batch_size=B, options=options, state=fresh)
    whole = keys(ds.take(40))
    ds, _ = reader.make_dataset(both, batch_size=B, options=options, state=start.advance(13))
    assert keys(ds.take(27)) == whole[13 * B :]
    # 2 workers stop after 9 batches; 3 take over: restricted to a source, each new
    # worker reads what that source alone, resumed elastically, gives it
    two = [
        reader.make_dataset(
            both, batch_size=B, options=options, state=fresh, num_workers=2, worker_index=w
        )[1]
        for w in range(2)
    ]
    saved = two[0].advance(9)
    assert reader.ReadState.from_json(saved.to_json()) == saved
    for j in range(3):
        ds, new = reader.make_dataset(
            both, batch_size=B, options=options, state=saved, num_workers=3, worker_index=j
        )
        got = keys(ds.take(30))
        assert new.num_workers == 3 and new.step == 0
        for part, path, name in zip(new.parts, sources, "ab"):
            alone, _ = reader.resume(
                path,
                "train",
                reader.ReadState.from_json(part),
                options,
                batch_size=1,
                num_workers=3,
                worker_index=j,
            )
            mine = only(got, name)
            assert keys(alone.take(len(mine))) == mine


def test_every_reader_mixes_alike_and_torch_saves_the_mix(sources):
    both = reader.mix([(sources[0], 3), (sources[1], 1)])
    kw = dict(image_size=(8, 8), epochs=1, **{**OPTS, "decode": True})
    want = [
        [k.decode() for k in b["key"].numpy()]
        for b in reader.make_dataset(both, batch_size=B, **kw)
    ]
    for backend in ("dali", "tf"):
        r = TorchReader(both, batch_size=B, backend=backend, **kw)
        got = [b["key"] for b in r]
        assert got == want, backend
        assert len(r) == len(want)
    r = TorchReader(both, batch_size=B, backend="dali", **kw)
    for i, _ in enumerate(r):
        if i == 9:
            break
    saved = r.state_dict()
    again = TorchReader(both, batch_size=B, backend="tf", **kw)
    again.load_state_dict(saved)
    assert [b["key"] for b in again] == want[10:]


def test_sources_that_do_not_fit_together_are_refused(sources, tmp_path):
    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=4)
    write_dataset(str(root), str(tmp_path / "other"), "--splits=train=1.0")
    with pytest.raises(ValueError, match="other labels"):
        reader.make_dataset(
            reader.mix([(sources[0], 1), (str(tmp_path / "other"), 1)]), batch_size=B, **OPTS
        )
    with pytest.raises(ValueError, match="weights must be numbers > 0"):
        reader.mix([(sources[0], 0)])
    both = reader.mix([(sources[0], 3), (sources[1], 1)])
    _, state = reader.make_dataset(both, batch_size=B, state=reader.ReadState(2, B), **OPTS)
    with pytest.raises(ValueError, match="mix with the saved weights"):
        reader.make_dataset(
            reader.mix([(sources[0], 1), (sources[1], 1)]),
            batch_size=B,
            state=state.advance(2),
            **OPTS,
        )
