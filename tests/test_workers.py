"""The worker processes' pipes (``reader.routes.workers``): the sending thread of large
batches (encoded images, as a state's excluded keys send) ends quietly when a read is
left with batches still queued in it (it died on its queue dropped: "Exception in
thread evenshard-send: AttributeError"), and an answer that does not unpickle in the
reader is an error saying so, the pipe kept at the next answer."""

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
    root = tmp_path_factory.mktemp("workers") / "images"
    synthetic.make_image_folder(
        str(root), num_labels=2, per_label=16, formats=("png",), size=(300, 300)
    )
    out = str(tmp_path_factory.mktemp("workers_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


@pytest.mark.parametrize("processes", [1, 2])
def test_leaving_a_read_with_large_batches_queued_kills_no_thread(data, processes, monkeypatch):
    from workers_transforms import slow_big_string

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    state = ReadState(4, 8).exclude(["no-such-key"])  # bytes sent, not places
    for _ in range(3):
        batches = reader.NumpyReader(
            data,
            "train",
            8,
            image_size=(12, 12),
            seed=4,
            epochs=4,
            transform=slow_big_string,
            num_processes=processes,
            state=state,
        )
        next(iter(batches))  # one batch, then the read left
        del batches
    deadline = time.monotonic() + 10
    while any(t.name == "evenshard-send" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a sending thread left running"
        time.sleep(0.05)
    assert not died, [f"{a.exc_type.__name__}: {a.exc_value}" for a in died]


def _refused():
    raise TypeError("this class cannot be rebuilt here")


class _Unbuildable:
    """Pickles, but does not unpickle, as an error class whose arguments do not rebuild
    it (not an exception itself: a library such as tblib may change how those pickle)."""

    def __reduce__(self):
        return _refused, ()


def test_an_answer_that_does_not_unpickle_is_an_error_and_the_pipe_goes_on():
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler

    from reader.routes.workers import _read
    from schemas.errors import OperationError

    here, there = multiprocessing.Pipe()
    there.send_bytes(ForkingPickler.dumps(("error", _Unbuildable())))
    there.send_bytes(ForkingPickler.dumps(("ok", {"block": "next"})))
    kind, error = _read(here)
    assert kind == "error" and isinstance(error, OperationError)
    assert "cannot be read here" in str(error) and "TypeError" in str(error)
    assert _read(here) == ("ok", {"block": "next"})
