"""TorchReader in torchdata's ``StatefulDataLoader``: the loader's own ``state_dict()``
resumes the read exactly, with no stack walked.

``StatefulDataLoader`` asks the dataset in each worker (or in the training process,
``num_workers=0``) for its ``state_dict()`` with every batch it sends, keeps the state
of the batches it yielded, and gives each worker its own back on resume. A worker's
reader says where its read stands and which batch it yields next
(``reader.handover.worker_state``), so a resumed loader yields the rest of the read,
in order; the batches travel untagged, so ``reader.handover`` never looks for the
DataLoader's iterator on the stack (``reader.compat.torch``).

One script runs every test's case in turn (DataLoader workers are forked from it, as in a
training script) over 51 images in batches of 4, 2 epochs: 26 batches.
"""

from __future__ import annotations

import json

import pytest
from conftest import script_outcomes
from dataset_writer import write_dataset

from evenshard import synthetic

pytest.importorskip("torchdata.stateful_dataloader")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stateful") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=17, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("stateful_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


SCRIPT = r"""
import hashlib, json, multiprocessing, pickle, sys
from torchdata.stateful_dataloader import StatefulDataLoader
from reader import handover
from reader.compat import torch as compat_torch
from reader.torch import TorchReader

data_dir = sys.argv[1]
walked = []
frames = compat_torch.caller_frames


def make(backend):
    return TorchReader(data_dir, "train", 4, image_size=(8, 8), seed=0, epochs=2, backend=backend)


def loader(reader, workers, **kw):
    return StatefulDataLoader(reader, batch_size=None, num_workers=workers, **kw)


def sig(batch):
    arrays = [batch[k].numpy().tobytes() for k in ("image", "label", "mask")]
    return [list(batch["key"]), hashlib.sha256(b"".join(arrays)).hexdigest()]


def resumes(backend, workers):
    walked.clear()
    compat_torch.caller_frames = lambda *a: walked.append(a) or iter(())
    whole = [sig(b) for b in loader(make(backend), workers)]
    out = {"whole": whole, "resumed": {}}
    for stop in (1, 7, 25):  # 7: with 2 workers, one has sent a batch more than the other
        first = loader(make(backend), workers)
        it = iter(first)
        got = [sig(next(it)) for _ in range(stop)]
        saved = first.state_dict()
        del it, first
        again = loader(make(backend), workers)
        again.load_state_dict(pickle.loads(pickle.dumps(saved)))
        out["resumed"][stop] = got + [sig(b) for b in again]
        out["size"] = len(pickle.dumps(saved))
    # each pass (of persistent workers too) reads the whole read again
    steady = loader(make(backend), workers, persistent_workers=workers > 0)
    out["passes"] = [[sig(b) for b in steady] for _ in range(2)]
    out["walked"] = len(walked)
    out["tagged"] = len(handover._RECEIVED)
    compat_torch.caller_frames = frames
    return out


def next_pass(backend, workers, persistent, stops):
    def resumed(saved, passes):
        again = loader(make(backend), workers, persistent_workers=persistent)
        again.load_state_dict(pickle.loads(pickle.dumps(saved)))
        return [[sig(b) for b in again] for _ in range(passes)]

    whole = [sig(b) for b in loader(make(backend), workers)]
    out = {"whole": whole, "mid": {}}
    for stop in stops:
        first = loader(make(backend), workers)
        it = iter(first)
        got = [sig(next(it)) for _ in range(stop)]
        saved = first.state_dict()
        del it, first
        passes = resumed(saved, 3)
        out["mid"][stop] = [got + passes[0], *passes[1:]]
    first = loader(make(backend), workers, persistent_workers=persistent)
    out["ended"] = [[sig(b) for b in first]]  # the pass ended: StopIteration
    out["ended"] += resumed(first.state_dict(), 2)
    return out


if __name__ == "__main__":  # the jobs in order, in one training script
    import tensorflow  # noqa: F401 - imported, never started here: each forked worker
    # starts its runtime, none imports it again (a preprocessing process does not import
    # it: it runs this file's top, as __mp_main__, and the fork server has those modules
    # already; the reader adds its own to these)
    top = ["torchdata.stateful_dataloader", "reader.torch"]
    multiprocessing.set_forkserver_preload(["__main__", *top])
    out = {}
    for name, job, *args in json.loads(sys.argv[2]):
        out[name] = globals()[job](*args)
        print(json.dumps(out), flush=True)
"""

# (name, function, its arguments): run in this order by one script, which forks the
# DataLoader workers (the training process never starts TensorFlow: its workers do; it
# imports it once, so that the tf workers' 10 forks do not each import it again).
RESUMES = [0, 2]
PASSES = [(0, False, "python"), (3, False, "python"), (2, True, "tf")]
JOBS = [(f"resumes {w}", "resumes", "dali", w) for w in RESUMES] + [
    # stop 1 (a worker that has sent nothing) on the python backend; 7 on each
    (f"passes {w} {p} {b}", "next_pass", b, w, p, [7] if b == "tf" else [1, 7])
    for w, p, b in PASSES
]


@pytest.fixture(scope="module")
def outcomes(data, tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("stateful_script") / "stateful.py"
    script.write_text(SCRIPT)
    return script_outcomes(script, data, json.dumps(JOBS), timeout=900)  # a hang: "hung: "


def outcome(outcomes, name: str) -> dict:
    assert outcomes["rc"].startswith("0: "), outcomes["rc"]
    return outcomes[name]


@pytest.mark.parametrize("workers", RESUMES)
def test_a_stateful_dataloader_resumes_exactly_mid_epoch(outcomes, workers):
    """Saved after 1, 7 and 25 of 26 batches (mid first epoch, mid second, the last one
    to come), a new loader given the state yields the rest of the uninterrupted read:
    the same keys and bytes, in order, none twice. Persistent workers read each pass
    whole. The state is a few ints a worker; no stack walked, no batch tagged."""
    out = outcome(outcomes, f"resumes {workers}")
    whole = out["whole"]
    assert len(whole) == 26
    for stop, got in out["resumed"].items():
        assert got == whole, stop
    assert out["passes"] == [whole, whole]
    assert out["size"] < 4096, out["size"]
    assert out["walked"] == 0 and out["tagged"] == 0


@pytest.mark.parametrize("workers, persistent, backend", PASSES)
def test_a_loaded_state_is_the_next_pass_only(outcomes, workers, persistent, backend):
    """Resumed after 1 (python backend) and 7 of 26 batches, the loader's pass gives the rest of the
    read, and the two passes after it the whole read, as an uninterrupted loader's
    passes do (never the resumed pass again: 0 workers read 19 a pass, persistent
    workers fewer each pass). A state saved after a pass ended resumes a whole pass,
    with any worker count, then another. Persistent workers on the tf backend build
    each pass's pipeline where TensorFlow started (not refused as after a fork)."""
    out = outcome(outcomes, f"passes {workers} {persistent} {backend}")
    whole = out["whole"]
    assert len(whole) == 26
    assert "7" in out["mid"], out["mid"].keys()
    for stop, passes in out["mid"].items():
        assert [len(p) for p in passes] == [26, 26, 26], stop
        assert passes == [whole, whole, whole], stop
    assert out["ended"] == [whole, whole, whole]
