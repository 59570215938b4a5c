"""``TorchReader(device=...)`` and ``NumpyReader(device=...)`` (JAX): batches moved
ahead of the loop, the reader's state the loop's.

On the CPU (``device="cpu"``) the feed runs as on a GPU but for the copy: two batches
ahead, the state the batches the loop took, blocks back once a batch is taken. The
page lock of the shared blocks is checked with a ``Pinning`` that records what it is
asked (CUDA's ``cudaHostRegister`` stands where no GPU is); on a CUDA machine the same
read runs on the GPU (skipped here, saying why; ``benchmarks/gpu_check.py`` measures it).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

import numpy as np
import pytest
import torch
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.routes import shared_blocks
from reader.routes.ahead import Ahead
from reader.torch import TorchReader
from schemas.errors import InvalidValueError, OperationError

B = 8  # 8 images of 32x32x3: 24,576 bytes, over shared_blocks.SMALL (lent)
OPTS = dict(image_size=(32, 32), seed=5, epochs=1, backend="python", num_processes=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """72 images in 3 shards: 9 batches of B."""
    root = tmp_path_factory.mktemp("device") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=24, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("device_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=3")
    return out


def _sig(batch) -> tuple:
    return tuple(batch["key"]), batch["image"].cpu().numpy().tobytes(), batch["label"].tolist()


def test_batches_and_state_are_the_loops_not_those_moved_ahead(data):
    plain = TorchReader(data, "train", B, **OPTS)
    moved = TorchReader(data, "train", B, device="cpu", **OPTS)
    expected, states = [], []
    for batch in plain:
        expected.append(_sig(batch))
        states.append(plain.state_dict())
    got = []
    it = iter(moved)
    start = moved.state_dict()
    for k, batch in enumerate(it):
        got.append(_sig(batch))
        # the feed has pulled up to two batches more; the state counts the loop's
        assert moved.state_dict() == states[k]
    assert got == expected and len(got) == 9
    assert start == TorchReader(data, "train", B, **OPTS).state_dict()

    # resumed from the state after 4 batches: the other 5, moved too
    again = TorchReader(data, "train", B, device="cpu", **OPTS)
    again.load_state_dict(states[3])
    assert again.state_dict() == states[3]
    assert [_sig(b) for b in again] == expected[4:]


def test_a_batch_taken_holds_its_block_and_the_feed_gives_blocks_back(data):
    owner = re.compile(rf"evenshard-[0-9a-f]{{12}}-{os.getpid()}-")
    kept = []
    moved = TorchReader(data, "train", B, device="cpu", **OPTS)
    for batch in moved:
        kept.append((batch["image"], batch["image"].numpy().copy()))
    for image, copy in kept:  # a block lent to a kept batch is never rewritten
        assert np.array_equal(image.numpy(), copy)
    del kept, batch, image
    assert not [n for n in os.listdir("/dev/shm") if owner.match(n)]


class Recorded:
    """A ``Pinning`` that records what it is asked and locks nothing."""

    def __init__(self):
        self.held: dict[int, int] = {}
        self.registered = 0

    def register(self, address: int, size: int) -> bool:
        assert address not in self.held, "a block registered twice"
        self.held[address] = size
        self.registered += 1
        return True

    def unregister(self, address: int) -> None:
        assert self.held.pop(address, None) is not None, "unregistered, never registered"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/shm")
def test_each_block_is_page_locked_once_while_mapped(data):
    pinning = Recorded()
    opts = dict(image_size=(64, 64), seed=5, epochs=1)  # 4 x 64x64x3: lent, not copied
    with shared_blocks.pinned(pinning):
        batches, last = 0, None
        for batch in reader.NumpyReader(data, "train", 4, num_processes=2, **opts):
            batches, last = batches + 1, batch
        del batch
        # blocks are reused, each registered once while mapped (Recorded checks it)
        assert batches == 18 and 1 <= pinning.registered <= batches // 2
        # the read ended; the last batch's block stays mapped, and locked, under it
        assert len(pinning.held) == 1
        del last
    assert pinning.held == {}  # every block unregistered before it was unmapped


def test_bad_devices_say_what_to_give(data):
    with pytest.raises(InvalidValueError, match="device='nowhere'"):
        TorchReader(data, "train", B, device="nowhere", **OPTS)
    with pytest.raises(InvalidValueError, match="moves batches to a CUDA device or the CPU"):
        TorchReader(data, "train", B, device="meta", **OPTS)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidValueError, match=r"torch.cuda.is_available\(\) is False"):
            TorchReader(data, "train", B, device="cuda", **OPTS)


def test_a_dataloader_worker_is_told_to_move_batches_in_the_loop(data):
    moved = TorchReader(data, "train", B, device="cpu", **{**OPTS, "num_processes": 0})
    loader = torch.utils.data.DataLoader(moved, batch_size=None, num_workers=1)
    with pytest.raises(Exception, match="in a DataLoader worker") as caught:
        next(iter(loader))
    assert "non_blocking=True" in str(caught.value)
    assert isinstance(caught.value, OperationError) or "OperationError" in str(caught.value)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the pinned copies run on a GPU machine "
    "(benchmarks/gpu_check.py, route torch_device)",
)
def test_on_a_gpu_batches_are_cuda_tensors_with_the_cpu_pixels(data):
    plain = [_sig(b) for b in TorchReader(data, "train", B, **OPTS)]
    got = []
    for batch in TorchReader(data, "train", B, device="cuda", **OPTS):
        assert batch["image"].is_cuda
        got.append(_sig(batch))
    assert got == plain


def test_numpy_reader_puts_batches_on_a_jax_device_ahead(data):
    jax = pytest.importorskip("jax")
    opts = {k: v for k, v in OPTS.items() if k != "backend"}
    plain = reader.NumpyReader(data, "train", B, **opts)
    expected, states = [], []
    for batch in plain:
        expected.append((list(batch["key"]), batch["image"].tobytes(), batch["label"].tolist()))
        states.append(plain.state_dict())
    put = reader.NumpyReader(data, "train", B, device="cpu", **opts)
    got = []
    for k, batch in enumerate(put):
        assert isinstance(batch["image"], jax.Array) and isinstance(batch["key"], list)
        assert batch["image"].devices() == {jax.devices("cpu")[0]}
        got.append((batch["key"], np.asarray(batch["image"]).tobytes(), batch["label"].tolist()))
        assert put.state_dict() == states[k]  # not the two batches put ahead
    assert got == expected
    again = reader.NumpyReader(data, "train", B, device="cpu", state=None, **opts)
    again.load_state_dict(states[5])
    assert [b["key"] for b in again] == [e[0] for e in expected[6:]]


def test_numpy_reader_names_a_device_jax_lacks(data):
    pytest.importorskip("jax")
    opts = {k: v for k, v in OPTS.items() if k != "backend"}
    with pytest.raises(InvalidValueError, match="device='tpu': JAX has no such device"):
        reader.NumpyReader(data, "train", B, device="tpu", **opts)
    with pytest.raises(InvalidValueError, match="a jax.Device, a Sharding or a platform"):
        reader.NumpyReader(data, "train", B, device=0, **opts)


def test_numpy_reader_takes_a_sharding(data):
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    opts = {k: v for k, v in OPTS.items() if k != "backend"}
    mesh = Mesh(np.array(jax.devices("cpu")), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batch = next(iter(reader.NumpyReader(data, "train", B, device=sharding, **opts)))
    assert batch["image"].sharding == sharding and batch["label"].shape == (B,)


SHARDED = """
import sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import reader
from schemas.errors import InvalidValueError

data = sys.argv[1]
opts = dict(image_size=(32, 32), seed=5, epochs=1, num_processes=0)
mesh = Mesh(np.array(jax.devices("cpu")), ("data",))
rows = NamedSharding(mesh, PartitionSpec("data"))
for size, more, said in [
    (7, {"drop_remainder": True}, "batch_size=7: the sharding cuts each batch's rows into 2"),
    (8, {}, "drop_remainder=True .training. or pad_final_batch=True"),
]:
    try:
        reader.NumpyReader(data, "train", size, device=rows, **opts, **more)
        raise SystemExit(f"batch_size={size} {more} was not refused")
    except InvalidValueError as e:
        assert __import__("re").search(said, str(e)), str(e)
evaluation = dict(opts, shuffle=False, pad_final_batch=True)
padded = list(reader.NumpyReader(data, "train", 10, device=rows, **evaluation))
assert len(padded) == 8 and int(np.asarray(padded[-1]["mask"]).sum()) == 2
assert all(len(b["image"].sharding.device_set) == 2 for b in padded)
dropped = reader.NumpyReader(data, "train", 10, device=rows, drop_remainder=True, **opts)
assert len(list(dropped)) == 7
endless = dict(opts, epochs=None)  # batches run across epochs: none is partial
taken = reader.NumpyReader(data, "train", 6, device=rows, **endless)
assert [b["image"].shape[0] for b in __import__("itertools").islice(taken, 5)] == [6] * 5
copies = NamedSharding(mesh, PartitionSpec())  # each device the whole batch: any batch
assert len(list(reader.NumpyReader(data, "train", 10, device=copies, **opts))) == 8
print("ok")
"""


def test_a_sharding_that_cuts_rows_needs_batches_it_can_cut(data, tmp_path):
    """Two CPU devices (XLA's host device count, set before JAX starts: a process of its
    own): an indivisible batch_size, and a final batch that may be partial, are refused
    when the reader is built, not two batches before the loop reaches them."""
    pytest.importorskip("jax")
    import subprocess

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    run = subprocess.run(
        [sys.executable, "-c", SHARDED, data], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_a_loop_left_early_stands_at_the_batches_it_took(data):
    import gc

    owner = re.compile(rf"evenshard-[0-9a-f]{{12}}-{os.getpid()}-")
    plain = TorchReader(data, "train", B, **OPTS)
    expected, states = [], []
    for batch in plain:
        expected.append(_sig(batch))
        states.append(plain.state_dict())
    moved = TorchReader(data, "train", B, device="cpu", **OPTS)
    it = iter(moved)
    for _ in range(3):
        next(it)
    saved = moved.state_dict()
    it.close()  # the loop left: the batches moved ahead are dropped, not counted
    assert saved == moved.state_dict() == states[2]
    again = TorchReader(data, "train", B, device="cpu", **OPTS)
    again.load_state_dict(saved)
    assert [_sig(b) for b in again] == expected[3:]
    del it, again, moved
    gc.collect()
    assert not [n for n in os.listdir("/dev/shm") if owner.match(n)]


class InFlight:
    """A ``Move`` whose copies finish only when waited for: it records the waits."""

    def __init__(self, events: list):
        self.events = events

    def check(self) -> None:
        pass

    @contextlib.contextmanager
    def session(self):
        yield lambda batch: (batch, lambda: self.events.append(("waited", batch)))


def test_copies_in_flight_are_waited_for_when_the_loop_leaves_early():
    """A break, or an error of the read, with batches moved ahead: their copies are
    waited for before the read ends (its blocks back, unmapped), not left in flight."""
    events = []

    def read(fail: bool):
        try:
            yield from range(3)
            if fail:
                raise ValueError("a record that cannot be read")
            yield from range(3, 9)
        finally:
            events.append(("read ended",))

    batches = Ahead(InFlight(events)).batches(read(False), dict)
    assert next(batches) == 0
    batches.close()
    assert events == [("waited", 0), ("waited", 1), ("waited", 2), ("read ended",)]

    events.clear()
    with pytest.raises(ValueError, match="cannot be read"):
        for _ in Ahead(InFlight(events)).batches(read(True), dict):
            pass
    # (the read ended first, raising: its blocks lent to the batches stay mapped)
    assert events == [("waited", 0), ("read ended",), ("waited", 1), ("waited", 2)]


def test_a_pass_not_yet_started_says_the_state_the_loop_took(data):
    """A loop that broke off, then ``iter()`` again before the first batch: the state
    of the batches the loop took, as without a device (NumpyReader's pass starts at its
    first batch), not those put ahead of it."""
    pytest.importorskip("jax")
    opts = {k: v for k, v in OPTS.items() if k != "backend"}
    said = {}
    for device in (None, "cpu"):
        put = reader.NumpyReader(data, "train", B, device=device, **opts)
        for k, _ in enumerate(put):
            if k == 2:
                break
        batches = iter(put)
        said[device] = put.state_dict()
        assert len(list(batches)) == 9
    assert said["cpu"] == said[None]
