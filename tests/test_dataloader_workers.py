"""``DataLoader(TorchReader, batch_size=None, num_workers=W)`` for any W (issue 29.4):
worker ``w`` of W yields the reader's batches ``w, w + W, ...``, so the DataLoader's
round robin gives the single-process order; ``state_dict()`` counts the batches the
training process received, and a new DataLoader with another W resumes exactly.

Each test runs a script (a DataLoader's workers are forked or spawned from it, as in a
training script) over one small dataset: 51 images, batches of 4, so 13 batches a
pass, a count neither 2 nor 3 divides. DALI with fork where workers need no
TensorFlow (quick to start); the tf backend with spawn once.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.records.record_offsets import Records
from reader.records.source import RecordSource

PY = sys.executable


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """51 PNG and JPEG images in 4 train shards."""
    root = tmp_path_factory.mktemp("loader") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=17, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("loader_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


RECIPE = r"""
import hashlib, json, multiprocessing, sys
import torch
import reader
from reader.torch import TorchReader

data_dir, backend, case = sys.argv[1:]
KW = dict(image_size=(8, 8), seed=0, backend=backend)


def make(**kw):
    return TorchReader(data_dir, "train", 4, **{**KW, **kw})


def loader(r, workers, **kw):
    if backend == "tf" and workers:
        kw.setdefault("multiprocessing_context", "forkserver")
    return torch.utils.data.DataLoader(r, batch_size=None, num_workers=workers, **kw)


def sig(batch):
    # keys, and the bytes of images, labels and mask
    arrays = [batch[k].numpy().tobytes() for k in ("image", "label", "mask")]
    return [list(batch["key"]), hashlib.sha256(b"".join(arrays)).hexdigest()]


def step(r):
    return reader.ReadState.from_json(r.state_dict()["read_state"]).step


def take(it, n, r):
    # n batches of iterator it, and the state's step after each
    got, steps = [], []
    for _ in range(n):
        got.append(sig(next(it)))
        steps.append(step(r))
    return got, steps


def orders():
    r = make()
    out = {"len": len(r), "direct": [sig(b) for b in r]}
    for workers, prefetch in [(0, None), (1, 2), (2, 1), (3, 3)]:
        batches = loader(r, workers, prefetch_factor=prefetch)
        out[f"W={workers}"] = [sig(b) for b in batches]
        assert len(batches) == len(r)
    # a rank of a multi-host read: the DataLoader deals that rank's batches
    rank = make(num_workers=2, worker_index=1)
    out["rank"] = [sig(b) for b in rank]
    out["rank W=3"] = [sig(b) for b in loader(rank, 3)]
    # an endless read, past its first epoch
    endless = make(epochs=None)
    out["endless"] = take(iter(endless), 30, endless)[0]
    out["endless W=3"] = take(iter(loader(endless, 3)), 30, endless)[0]
    return out


def resume():
    whole = [sig(b) for b in make(epochs=2)]
    r = make(epochs=2)
    got, steps = take(iter(loader(r, 2)), 7, r)  # 7: worker 0 sent one batch more than 1
    saved = r.state_dict()
    out = {"whole": whole, "steps": steps}
    for workers in (3, 0):
        rest = make(epochs=2)
        rest.load_state_dict(saved)
        out[f"2 then {workers}"] = got + [sig(b) for b in loader(rest, workers)]
    # and again: 5 batches under W=3, the rest under W=1
    second = make(epochs=2)
    second.load_state_dict(saved)
    more, _ = take(iter(loader(second, 3)), 5, second)
    last = make(epochs=2)
    last.load_state_dict(second.state_dict())
    out["2, 3 then 1"] = got + more + [sig(b) for b in loader(last, 1)]
    return out


def persistent():
    r = make()
    out = {"direct": [sig(b) for b in r]}
    batches = loader(r, 2, persistent_workers=True, prefetch_factor=1)
    out["passes"] = [[sig(b) for b in batches] for _ in range(2)]
    left, _ = take(iter(batches), 3, r)  # a pass left early: the next starts the read again
    it = iter(batches)
    again, steps = take(it, 2, r)
    saved = r.state_dict()
    out["left early"] = left
    out["after"] = again + [sig(b) for b in it]
    out["steps"] = steps
    r.load_state_dict(saved)  # the workers hold the state they started with
    try:
        [sig(b) for b in batches]
        out["refused"] = None
    except RuntimeError as e:
        out["refused"] = str(e).strip().splitlines()[-1].split("Error: ", 1)[-1]
    fresh = loader(r, 3, persistent_workers=True)  # made after load_state_dict: reads
    out["fresh"] = [[sig(b) for b in fresh] for _ in range(2)]
    try:  # batches as the workers finish them
        [sig(b) for b in loader(make(), 2, in_order=False)]
        out["unordered"] = None
    except RuntimeError as e:
        out["unordered"] = str(e)
    return out


def tf_workers():
    r = make()
    it = iter(loader(r, 2))
    got, steps = take(it, 3, r)
    saved = r.state_dict()
    out = {"W=2": got + [sig(b) for b in it], "steps": steps}
    del it
    rest = make()  # TensorFlow starts here, after the workers
    rest.load_state_dict(saved)
    out["resumed"] = got + [sig(b) for b in rest]
    out["direct"] = [sig(b) for b in make()]
    return out


if __name__ == "__main__":  # spawned workers import this file
    # forkserver workers fork from a server that imported this file's modules and
    # TensorFlow (never started there) once, rather than each importing them again
    multiprocessing.set_forkserver_preload(["__main__", "reader.torch", "tensorflow"])
    print(json.dumps(globals()[case]()))
"""


def run(tmp_path, data, backend: str, case: str) -> dict:
    script = tmp_path / "loader.py"
    script.write_text(RECIPE)
    done = subprocess.run(
        [PY, str(script), data, backend, case], capture_output=True, text=True, timeout=240
    )  # a hang fails here (TimeoutExpired)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_any_worker_count_gives_the_batches_of_one_process(data, tmp_path):
    """W = 0, 1, 2, 3 (prefetch 1 to 3): the same keys and bytes in the same order as
    iterating the reader; 13 batches end mid-round for 2 and 3 workers. A rank of two
    (num_workers/worker_index) is dealt within its own batches; an endless read too."""
    out = run(tmp_path, data, "dali", "orders")
    want = out["direct"]
    assert out["len"] == len(want) == 13
    for workers in range(4):
        assert out[f"W={workers}"] == want, workers
    assert 0 < len(out["rank"]) < 13 and out["rank W=3"] == out["rank"]
    assert out["endless W=3"] == out["endless"]
    # batches run across epochs: the first epoch's 51 keys, then the next one's
    assert out["endless"][:12] == want[:12] and out["endless"][12][0][:3] == want[12][0]


def test_a_state_saved_under_two_workers_resumes_under_three_and_none(data, tmp_path):
    """Saved after 7 batches of DataLoader(num_workers=2) (a worker one batch ahead of
    the other), resumed by DataLoader(3) and by the reader itself, then saved under 3
    and resumed under 1: each time the rest of the uninterrupted read, no more."""
    out = run(tmp_path, data, "dali", "resume")
    assert len(out["whole"]) == 26  # 2 epochs of 51: 25 batches and a part
    assert out["steps"] == list(range(1, 8))  # counted as the training loop received them
    for case in ("2 then 3", "2 then 0", "2, 3 then 1"):
        assert out[case] == out["whole"], case


def test_persistent_workers_read_each_pass_whole_and_refuse_an_old_state(data, tmp_path):
    """persistent_workers=True: each pass (one left early too) is the reader's read;
    load_state_dict() after the workers started is refused in one line (they hold the
    state they started with; the DataLoader re-raises it, the line last), and a
    DataLoader made after it reads from that state. in_order=False is refused too."""
    out = run(tmp_path, data, "dali", "persistent")
    want = out["direct"]
    assert out["passes"] == [want, want]
    assert out["left early"] == want[:3] and out["after"] == want
    assert out["steps"] == [1, 2]  # the new pass's count, not the last one's
    assert out["refused"] == (
        "TorchReader.load_state_dict() after a DataLoader(persistent_workers=True) started "
        "its workers, which still hold the state they started with: make the DataLoader "
        "after load_state_dict(), or use persistent_workers=False"
    )
    assert out["fresh"] == [want[2:], want[2:]]
    assert out["unordered"] == (
        "TorchReader in a DataLoader(in_order=False) with num_workers=2: it would hand the "
        "batches over as the workers finish them, out of the read's order; leave "
        "in_order=True (the default)"
    )


def test_the_tf_backend_in_forkserver_workers(data, tmp_path):
    """backend="tf" (TensorFlow cannot be forked once started: forkserver): two workers
    give the batches of one process, and a state saved after 3 of them resumes in the
    training process."""
    out = run(tmp_path, data, "tf", "tf_workers")
    assert out["W=2"] == out["direct"] and len(out["direct"]) == 13
    assert out["steps"] == [1, 2, 3]
    assert out["resumed"] == out["direct"]


def _rows(source) -> list:
    """Each batch's keys, labels, mask, epochs and encoded images."""
    return [
        (
            b.key,
            b.label.tolist(),
            b.mask.tolist(),
            b.epoch.tolist(),
            [e.tobytes() for e in b.encoded],
        )
        for b in source
    ]


def test_the_record_source_deals_batches_reading_only_the_records_of_its_own(data, monkeypatch):
    """What a DataLoader worker's DALI pipeline is fed (``RecordSource.deal``): its batches
    of the read, and only their records fetched. A plain read over 2 epochs, a mixture,
    a padded rank (all-padding batches at the end) and an elastic lead (a state of 2
    workers read by 3)."""
    o = reader.ReadOptions(image_size=(8, 8), seed=0)
    two = dataclasses.replace(o, num_workers=2, worker_index=0)
    elastic = RecordSource(data, "train", 4, two, reader.ReadState(0, 4)).read.state.advance(3)
    reads = {
        "plain": (data, dataclasses.replace(o, epochs=2), None),
        "mixed": (reader.mix([(data, 2), (data, 1)]), o, None),
        "padded rank": (
            data,
            dataclasses.replace(
                o, shuffle=False, pad_final_batch=True, num_workers=3, worker_index=2
            ),
            None,
        ),
        "elastic": (data, dataclasses.replace(o, num_workers=3, worker_index=1), elastic),
    }
    fetched = []
    get = Records.get
    monkeypatch.setattr(Records, "get", lambda self, i: fetched.append(i) or get(self, i))
    for name, (source, options, state) in reads.items():
        read = RecordSource(source, "train", 4, options, state)
        whole = _rows(read)
        if name == "padded rank":
            assert not any(whole[-1][2])  # an all-padding batch (a filler image fetched)
        if name == "elastic":
            assert read.read.sources[0].share.lead is not None
        for workers in (2, 3):
            dealt = []
            for w in range(workers):
                part = RecordSource(source, "train", 4, options, state)
                part.deal(workers, w)
                fetched.clear()
                dealt.append(_rows(part))
                assert len(dealt[-1]) == len(part) == len(range(w, len(whole), workers))
                real = sum(sum(mask) for _, _, mask, _, _ in dealt[-1])
                padding = sum(not any(mask) for _, _, mask, _, _ in dealt[-1])
                assert len(fetched) == real + padding, (name, workers, w)  # its own only
            merged = [dealt[i % workers][i // workers] for i in range(len(whole))]
            assert merged == whole, (name, workers)


@pytest.mark.parametrize("pad", [False, True])
def test_make_dataset_deals_undecoded_batches_to_workers(data, pad):
    """The tf backend's share of a DataLoader worker: graph.dataset(deal=(W, w)) yields
    batches w, w + W, ... of the read (padding counted over the whole read), with their
    cardinality."""
    from reader.front.read import merge, resolve
    from reader.routes import graph

    kw = dict(image_size=(8, 8), shuffle=False, pad_final_batch=pad)
    whole = [b["key"].numpy().tolist() for b in reader.make_dataset(data, "train", 4, **kw)]
    for every in (2, 3):
        for first in range(every):
            read = resolve(data, "train", 4, merge(None, kw))
            ds = graph.dataset(read, deal=(every, first))
            got = [b["key"].numpy().tolist() for b in ds]
            assert got == whole[first::every]
            assert ds.cardinality().numpy() == len(got)


PASSES = r"""
import json, multiprocessing, sys
import torch
import reader
from reader.torch import TorchReader

data_dir = sys.argv[1]


def make():
    return TorchReader(data_dir, "train", 4, image_size=(8, 8), seed=0, epochs=2, backend="python")


def loader(r, how):
    # the reader itself, or a DataLoader without workers: passes in this process
    return r if how == "reader" else torch.utils.data.DataLoader(r, batch_size=None)


def keys(batches):
    return [list(b["key"]) for b in batches]


def step(r):
    return reader.ReadState.from_json(r.state_dict()["read_state"]).step


def read_passes(how):
    whole = keys(loader(make(), how))
    r = make()
    it = iter(loader(r, how))
    got = keys(next(it) for _ in range(7))
    saved = r.state_dict()
    del it
    again = make()
    again.load_state_dict(saved)
    resumed = loader(again, how)
    passes = [got + keys(resumed)]
    it = iter(resumed)  # a second pass: from the read's beginning, counted from there
    second = keys(next(it) for _ in range(5))
    at = again.state_dict()
    passes.append(second + keys(it))
    passes.append(keys(resumed))
    last = make()
    last.load_state_dict(at)
    return {"whole": whole, "passes": passes, "step": step(again),
            "at": second + keys(loader(last, how))}


if __name__ == "__main__":  # both ways in one process: one start of torch and the pool's
    # the pool's processes run this file's top (as __mp_main__): forked from a server
    # that has its modules, none imports torch again; the reader adds its own to these
    multiprocessing.set_forkserver_preload(["__main__", "reader.torch"])
    print(json.dumps({how: read_passes(how) for how in ("reader", "loader")}))
"""


@pytest.fixture(scope="module")
def passes(data, tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("passes") / "passes.py"
    script.write_text(PASSES)
    done = subprocess.run([PY, str(script), data], capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["reader", "loader"])
def test_a_loaded_state_is_read_by_the_next_pass_only(passes, how):
    """A reader given a state, iterated in the training process (itself, or in a
    DataLoader without workers): the first pass gives the rest of the read, the passes
    after it the whole read (26 batches, 2 epochs), as the uninterrupted reader's do
    (was: the rest again, each pass); state_dict() mid-way through the second pass
    counts from the beginning, and resumes there."""
    out = passes[how]
    whole = out["whole"]
    assert len(whole) == 26
    assert out["passes"] == [whole, whole, whole]
    assert out["at"] == whole
    assert out["step"] == 26  # the third pass, whole, counted from the beginning
