"""Review 63b: the sending thread of ``reader.routes.workers`` (large batches: encoded
images, as a state's excluded keys send) must end quietly when a read is left with
batches still queued in it, not die on ``self._sending`` set to None
("Exception in thread evenshard-send: AttributeError")."""

from __future__ import annotations

import threading
import time

import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader import ReadState


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """32 noisy 300x300 PNGs: a batch of 8 encoded is ~2 MB, over ``workers.SMALL``."""
    root = tmp_path_factory.mktemp("r63b") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=16, formats=("png",), size=(300, 300))
    out = str(tmp_path_factory.mktemp("r63b_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


@pytest.mark.parametrize("processes", [1, 2])
def test_leaving_a_read_with_large_batches_queued_kills_no_thread(data, processes, monkeypatch):
    from review63b_transforms import slow_big_string

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    state = ReadState(4, 8).exclude(["no-such-key"])  # bytes sent, not places
    for _ in range(3):
        batches = reader.NumpyReader(
            data, "train", 8, image_size=(12, 12), seed=4, epochs=4,
            transform=slow_big_string, num_processes=processes, state=state,
        )
        for batch in batches:
            break
        del batches
    deadline = time.monotonic() + 10
    while any(t.name == "evenshard-send" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a sending thread left running"
        time.sleep(0.05)
    assert not died, [f"{a.exc_type.__name__}: {a.exc_value}" for a in died]
