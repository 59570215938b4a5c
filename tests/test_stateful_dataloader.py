"""TorchReader in torchdata's ``StatefulDataLoader``: the loader's own ``state_dict()``
resumes the read exactly, with no stack walked.

``StatefulDataLoader`` asks the dataset in each worker (or in the training process,
``num_workers=0``) for its ``state_dict()`` with every batch it sends, keeps the state
of the batches it yielded, and gives each worker its own back on resume. A worker's
reader says where its read stands and which batch it yields next
(``reader.handover.worker_state``), so a resumed loader yields the rest of the read,
in order; the batches travel untagged, so ``reader.handover`` never looks for the
DataLoader's iterator on the stack (``reader.compat_torch``).

Each test runs a script (DataLoader workers are forked from it, as in a training
script) over 51 images in batches of 4, 2 epochs: 26 batches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
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
import hashlib, json, pickle, sys
from torchdata.stateful_dataloader import StatefulDataLoader
from reader import compat_torch, handover
from reader.torch import TorchReader

data_dir, workers, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
walked = []
compat_torch.caller_frames = lambda *a: walked.append(a) or iter(())


def make():
    return TorchReader(data_dir, "train", 4, image_size=(8, 8), seed=0, epochs=2, backend=backend)


def loader(reader, **kw):
    return StatefulDataLoader(reader, batch_size=None, num_workers=workers, **kw)


def sig(batch):
    arrays = [batch[k].numpy().tobytes() for k in ("image", "label", "mask")]
    return [list(batch["key"]), hashlib.sha256(b"".join(arrays)).hexdigest()]


whole = [sig(b) for b in loader(make())]
out = {"whole": whole, "resumed": {}}
for stop in (1, 7, 25):  # 7: with 2 workers, one has sent a batch more than the other
    first = loader(make())
    it = iter(first)
    got = [sig(next(it)) for _ in range(stop)]
    saved = first.state_dict()
    del it, first
    again = loader(make())
    again.load_state_dict(pickle.loads(pickle.dumps(saved)))
    out["resumed"][stop] = got + [sig(b) for b in again]
    out["size"] = len(pickle.dumps(saved))
# each pass (of persistent workers too) reads the whole read again
steady = loader(make(), persistent_workers=workers > 0)
out["passes"] = [[sig(b) for b in steady] for _ in range(2)]
out["walked"] = len(walked)
out["tagged"] = len(handover._RECEIVED)
print(json.dumps(out))
"""


def run(tmp_path, data, workers: int, backend: str = "dali") -> dict:
    script = tmp_path / "stateful.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), data, str(workers), backend],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_resumes_exactly_mid_epoch(data, tmp_path, workers):
    """Saved after 1, 7 and 25 of 26 batches (mid first epoch, mid second, the last one
    to come), a new loader given the state yields the rest of the uninterrupted read:
    the same keys and bytes, in order, none twice. Persistent workers read each pass
    whole. The state is a few ints a worker; no stack walked, no batch tagged."""
    out = run(tmp_path, data, workers)
    whole = out["whole"]
    assert len(whole) == 26
    for stop, got in out["resumed"].items():
        assert got == whole, stop
    assert out["passes"] == [whole, whole]
    assert out["size"] < 4096, out["size"]
    assert out["walked"] == 0 and out["tagged"] == 0


PASSES = r"""
import hashlib, json, pickle, sys
from torchdata.stateful_dataloader import StatefulDataLoader
from reader.torch import TorchReader

data_dir, workers, persistent, backend = sys.argv[1:]
workers, persistent = int(workers), persistent == "1"


def make():
    return TorchReader(data_dir, "train", 4, image_size=(8, 8), seed=0, epochs=2, backend=backend)


def loader(reader, **kw):
    return StatefulDataLoader(reader, batch_size=None, num_workers=workers, **kw)


def sig(batch):
    arrays = [batch[k].numpy().tobytes() for k in ("image", "label", "mask")]
    return [list(batch["key"]), hashlib.sha256(b"".join(arrays)).hexdigest()]


def resumed(saved, passes):
    again = loader(make(), persistent_workers=persistent)
    again.load_state_dict(pickle.loads(pickle.dumps(saved)))
    return [[sig(b) for b in again] for _ in range(passes)]


if __name__ == "__main__":
    whole = [sig(b) for b in loader(make())]
    out = {"whole": whole, "mid": {}}
    for stop in (1, 7):
        first = loader(make())
        it = iter(first)
        got = [sig(next(it)) for _ in range(stop)]
        saved = first.state_dict()
        del it, first
        passes = resumed(saved, 3)
        out["mid"][stop] = [got + passes[0], *passes[1:]]
    first = loader(make(), persistent_workers=persistent)
    out["ended"] = [[sig(b) for b in first]]  # the pass ended: StopIteration
    out["ended"] += resumed(first.state_dict(), 2)
    print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "workers, persistent, backend", [(0, False, "python"), (2, False, "python"), (3, True, "tf")]
)
def test_a_loaded_state_is_the_next_pass_only(data, tmp_path, workers, persistent, backend):
    """Resumed after 1 and 7 of 26 batches, the loader's pass gives the rest of the
    read, and the two passes after it the whole read, as an uninterrupted loader's
    passes do (never the resumed pass again: 0 workers read 19 a pass, persistent
    workers fewer each pass). A state saved after a pass ended resumes a whole pass,
    with any worker count, then another. Persistent workers on the tf backend build
    each pass's pipeline where TensorFlow started (not refused as after a fork)."""
    script = tmp_path / "passes.py"
    script.write_text(PASSES)
    args = [sys.executable, str(script), data, str(workers), "1" if persistent else "0", backend]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    whole = out["whole"]
    assert len(whole) == 26
    for stop, passes in out["mid"].items():
        assert [len(p) for p in passes] == [26, 26, 26], stop
        assert passes == [whole, whole, whole], stop
    assert out["ended"] == [whole, whole, whole]
