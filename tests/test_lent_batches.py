"""The Python route's batches lent from shared memory (issue 44): a batch's arrays are
views of the block a worker process wrote, no copy made; the block is reused only once
every array of the batch, and every view or tensor made from one, is gone; a block
still lent when the read ends is unlinked, its arrays still readable."""

from __future__ import annotations

import gc
import os
import re
import signal
import sys

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.routes.shared_blocks import SMALL

B = 8  # a batch of 8 images of 64x64x3: 98,304 bytes, over SMALL (lent, not copied)
OPTS = dict(image_size=(64, 64), seed=3, epochs=2)
P = 2  # worker processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/shm")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """96 images in 2 train shards: 24 batches of B over 2 epochs."""
    root = tmp_path_factory.mktemp("lent") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=48, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("lent_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


@pytest.fixture(scope="module")
def copies(data):
    """Every batch of the read, copied as it came (the reference)."""
    return [
        {k: np.array(v) if isinstance(v, np.ndarray) else list(v) for k, v in b.items()}
        for b in reader.NumpyReader(data, "train", B, num_processes=P, **OPTS)
    ]


def _all_blocks() -> set[str]:
    owner = re.compile(rf"evenshard-[0-9a-f]{{12}}-{os.getpid()}-")
    return {n for n in os.listdir("/dev/shm") if owner.match(n)}


_BEFORE: set[str] = set()


@pytest.fixture(autouse=True)
def _only_this_tests_blocks():
    """Blocks this process held before the test (a read another test file of this
    pytest worker left open) are not this test's to count."""
    _BEFORE.clear()
    _BEFORE.update(_all_blocks())


def _blocks() -> list[str]:
    """The shared memory blocks of this test's reads."""
    return sorted(_all_blocks() - _BEFORE)


def _same(batch: dict, copy: dict) -> None:
    assert batch.keys() == copy.keys()
    for name, value in copy.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(batch[name], value, err_msg=name)
        else:
            assert list(batch[name]) == value, name


def test_a_batch_is_lent_without_a_copy_and_its_small_fields_are_copies(data):
    batch = next(iter(reader.NumpyReader(data, "train", B, num_processes=P, **OPTS)))
    image = batch["image"]
    assert type(image.base).__name__ == "_Lent"  # a view of the block, no copy
    assert image.flags.writeable and image.flags.c_contiguous
    assert image.nbytes >= SMALL
    for name in ("label", "mask", "epoch", "view"):  # under SMALL: a kept label holds no block
        assert batch[name].base is None, name


def test_a_batch_held_while_20_more_are_read_is_unchanged(data, copies):
    batches = iter(reader.NumpyReader(data, "train", B, num_processes=P, **OPTS))
    held = next(batches)
    at_once = {k: np.array(v) for k, v in held.items() if isinstance(v, np.ndarray)}
    for number in range(1, 21):
        _same(next(batches), copies[number])
    for name, value in at_once.items():
        np.testing.assert_array_equal(held[name], value)
    _same(held, copies[0])


def test_every_batch_kept_stays_itself_and_shared_memory_stays_bounded(data, copies):
    kept, most = [], 0
    for batch in reader.NumpyReader(data, "train", B, num_processes=P, **OPTS):
        kept.append(batch)
        most = max(most, len(_blocks()))
    assert len(kept) == len(copies) == 24
    for batch, copy in zip(kept, copies):
        _same(batch, copy)
    lent = sum(type(b["image"].base).__name__ == "_Lent" for b in kept)
    assert 1 <= lent <= max(4, 2 * P)  # the rest copied out: heap, not /dev/shm
    assert most <= 2 * P + max(4, 2 * P) + 1  # in flight, lent, one being made
    assert _blocks() == []


def test_slices_and_torch_tensors_keep_a_dropped_batch_valid(data, copies):
    torch = pytest.importorskip("torch")
    batches = iter(reader.NumpyReader(data, "train", B, num_processes=P, **OPTS))
    batch = next(batches)
    part = batch["image"][2:5, 10:20]
    row = batch["image"][7]
    tensor = torch.from_numpy(batch["image"])
    del batch  # only the slices and the tensor hold the block now
    gc.collect()
    for number in range(1, 21):
        _same(next(batches), copies[number])
    np.testing.assert_array_equal(part, copies[0]["image"][2:5, 10:20])
    np.testing.assert_array_equal(row, copies[0]["image"][7])
    np.testing.assert_array_equal(tensor.numpy(), copies[0]["image"])
    batches.close()
    assert _blocks() == []
    np.testing.assert_array_equal(tensor.numpy(), copies[0]["image"])  # read ended


def test_dropped_batches_reuse_a_few_blocks(data, copies):
    names: set[str] = set()
    for number, batch in enumerate(reader.NumpyReader(data, "train", B, num_processes=P, **OPTS)):
        _same(batch, copies[number])
        names.update(_blocks())
        del batch
    assert len(names) <= 2 * P + 2  # in flight, the one yielded, the one before it
    assert _blocks() == []


def test_a_batch_held_after_the_read_ended_keeps_its_values_and_no_block_is_left(data, copies):
    for route in (P, 0):  # worker processes; the reader's own
        batches = iter(reader.NumpyReader(data, "train", B, num_processes=route, **OPTS))
        first, second = next(batches), next(batches)
        part = first["image"][:, ::2]
        assert type(second["image"].base).__name__ == "_Lent"
        batches.close()  # the read left early: its blocks unlinked, these two still mapped
        assert _blocks() == []
        _same(first, copies[0])
        _same(second, copies[1])
        del first
        gc.collect()
        np.testing.assert_array_equal(part, copies[0]["image"][:, ::2])
        first = list(reader.NumpyReader(data, "train", B, num_processes=route, **OPTS))
        assert _blocks() == []  # read to its end too
        for batch, copy in zip(first, copies):
            _same(batch, copy)


def kill_in_epoch_1(example, rng):
    """A transform whose process is killed (kill -9) in the read's second epoch."""
    if example["epoch"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return example


def test_a_batch_held_when_a_worker_is_killed_stays_valid_and_no_block_is_left(data, copies):
    batches = iter(
        reader.NumpyReader(data, "train", B, num_processes=P, transform=kill_in_epoch_1, **OPTS)
    )
    held = [next(batches) for _ in range(3)]
    with pytest.raises(RuntimeError, match="a preprocessing process died"):
        for _ in batches:
            pass
    assert _blocks() == []
    for batch, copy in zip(held, copies):
        _same(batch, copy)


def test_torch_reader_python_batches_held_stay_themselves(data, copies):
    pytest.importorskip("torch")
    from reader.torch import TorchReader

    batches = iter(TorchReader(data, "train", B, backend="python", num_processes=P, **OPTS))
    held = next(batches)
    for number in range(1, 21):
        np.testing.assert_array_equal(next(batches)["image"].numpy(), copies[number]["image"])
    np.testing.assert_array_equal(held["image"].numpy(), copies[0]["image"])
    del batches
    gc.collect()
    assert _blocks() == []
    np.testing.assert_array_equal(held["image"].numpy(), copies[0]["image"])


def same_example(example, rng):
    """A transform that changes nothing (the read goes through the Python route)."""
    return example


def test_make_dataset_tensors_of_lent_batches_stay_themselves(data, copies):
    tf = pytest.importorskip("tensorflow")
    ds = reader.make_dataset(
        data, "train", B, num_processes=P, transform=same_example, prefetch=2, **OPTS
    )
    batches = iter(ds)
    held = next(batches)["image"]
    for number in range(1, 21):
        np.testing.assert_array_equal(next(batches)["image"].numpy(), copies[number]["image"])
    np.testing.assert_array_equal(held.numpy(), copies[0]["image"])
    rest = list(batches)
    assert len(rest) == 3
    del batches, rest, ds
    gc.collect()
    assert _blocks() == []
    assert isinstance(held, tf.Tensor)
    np.testing.assert_array_equal(held.numpy(), copies[0]["image"])
