"""TorchReader's Python route with ``views=2`` resumes where it stopped.

A batch of 4 rows holds 2 images, each twice (views together): the read's state
counts batches of images, as NumpyReader's does, so a state saved after k batches
resumes at image 2k, not 4k. Resumed by ``state_dict()`` / ``load_state_dict()`` and
under torchdata's ``StatefulDataLoader`` (0 and 2 workers), the batches are the
uninterrupted read's remaining ones: the same keys, and the same views' bytes (the
transform draws from its rng, so each view differs).

The three cases run in turn in one script (one start of the interpreter, torch and
the reader; the DataLoader workers are forked from it). 51 images, batches of 4 rows
(2 images x 2 views), one epoch: 26 batches.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dataset_writer import write_dataset

from evenshard import synthetic


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("views") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=17, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("views_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


SCRIPT = r"""
import hashlib, json, pickle, sys
import numpy as np
import reader
from reader.torch import TorchReader

data_dir, hows = sys.argv[1], sys.argv[2]


def shift(example, rng):
    # a view of its own: rolled by an amount drawn from the view's rng
    return {**example, "image": np.roll(example["image"], int(rng.integers(1, 7)), axis=1)}


def make():
    return TorchReader(data_dir, "train", 4, image_size=(8, 8), seed=0, epochs=1,
                       backend="python", views=2, transform=shift, num_processes=0)


def sig(batch):
    arrays = [batch[k].numpy().tobytes() for k in ("image", "label", "mask")]
    return [list(batch["key"]), hashlib.sha256(b"".join(arrays)).hexdigest()]


def case(how):
    def loader(r):
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(r, batch_size=None, num_workers=int(how))

    plain = how == "plain"
    whole = [sig(b) for b in (make() if plain else loader(make()))]
    out = {"whole": whole, "len": len(make()), "resumed": {}, "steps": {}}
    for stop in (1, 3, 25):
        first = make() if plain else loader(make())
        it = iter(first)
        got = [sig(next(it)) for _ in range(stop)]
        saved = pickle.loads(pickle.dumps(first.state_dict()))
        del it
        if plain:
            out["steps"][stop] = reader.ReadState.from_json(saved["read_state"]).step
        again = make() if plain else loader(make())
        again.load_state_dict(saved)
        out["resumed"][stop] = got + [sig(b) for b in again]
    return out


if __name__ == "__main__":  # the cases in turn; each one's outcome, or its error
    out = {}
    for how in hows.split(","):
        try:
            out[how] = case(how)
        except ImportError as e:  # no torchdata: the test skips
            out[how] = {"error": repr(e)}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcomes(data, tmp_path_factory) -> tuple[int, str, dict]:
    """The script's exit status, stderr's tail and each case's outcome, by case."""
    script = tmp_path_factory.mktemp("views_script") / "views.py"
    script.write_text(SCRIPT)
    args = [sys.executable, str(script), data, "plain,0,2"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    return done.returncode, done.stderr[-3000:], json.loads(lines[-1]) if lines else {}


@pytest.mark.parametrize("how", ["plain", "0", "2"])
def test_views_together_resume_exactly(outcomes, how):
    """Saved after 1, 3 and 25 of 26 batches (plain state_dict, StatefulDataLoader
    with 0 and 2 workers), the resumed read gives the rest: keys and views' bytes
    equal to the uninterrupted read's, none skipped or twice; the state's step counts
    the batches (of 2 images each), and len() the batches of rows."""
    rc, err, cases = outcomes
    assert rc == 0, err
    out = cases[how]
    if how != "plain" and "error" in out:  # the script could not import torchdata's loader
        pytest.skip(f"torchdata.stateful_dataloader: {out['error']}")
    whole = out["whole"]
    assert len(whole) == out["len"] == 26
    assert [len(keys) for keys, _ in whole] == [4] * 25 + [2]
    assert all(keys[0] == keys[1] and keys[2] == keys[3] for keys, _ in whole[:25])
    for stop, got in out["resumed"].items():
        assert got == whole, stop
    assert out["steps"] in ({}, {"1": 1, "3": 3, "25": 25})


def test_views_spread_are_numpy_readers_batches_and_resume_exactly(data):
    """Every face takes what every face can: TorchReader(view_spread=2) gives
    NumpyReader's spread batches as tensors, saves where it stands between an image's
    views (its state_dict has the route's view_skip) and a new reader resumes there;
    a later pass reads from the beginning; a DataLoader worker is refused in one
    line (before: "unexpected keyword argument 'view_spread'")."""
    import numpy as np
    import torch

    import reader
    from reader.torch import TorchReader

    kw = dict(image_size=(8, 8), seed=0, epochs=1, views=2, view_spread=2, num_processes=0)
    want = [
        (list(b["key"]), b["view"].tolist(), b["image"].copy())
        for b in reader.NumpyReader(data, "train", 4, **kw)
    ]

    def got(r):
        return [(list(b["key"]), b["view"].tolist(), b["image"].numpy()) for b in r]

    def same(a, b):
        assert len(a) == len(b)
        for (k1, v1, i1), (k2, v2, i2) in zip(a, b):
            assert k1 == k2 and v1 == v2 and np.array_equal(i1, i2)

    first = TorchReader(data, "train", 4, backend="python", **kw)
    same(got(first), want)
    saved, seen = None, []
    for i, b in enumerate(first):  # a second pass: from the beginning
        seen.append((list(b["key"]), b["view"].tolist(), b["image"].numpy()))
        if i == 4:
            saved = first.state_dict()
    same(seen, want)
    assert "view_skip" in saved
    again = TorchReader(data, "train", 4, backend="python", **kw)
    again.load_state_dict(saved)
    same(got(again), want[5:])
    same(got(again), want)  # its next pass: the beginning
    loader = torch.utils.data.DataLoader(
        TorchReader(data, "train", 4, backend="python", **kw), batch_size=None, num_workers=1
    )
    with pytest.raises(Exception, match="views spread are not dealt to workers"):
        next(iter(loader))
