"""Built-in augmentations (issue 29.2): torchvision's random resized crop and a flip,
drawn per (seed, key, epoch, view) by one function every reader asks, so tf.data, DALI
and the Python route crop the same box and flip alike; a resumed read augments as the
uninterrupted one."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.decode.pixels import decode as _decode
from reader.decode.pixels import resize as _resize
from reader.order.augment import Augment

AUG = dict(random_crop=True, random_flip=True, crop_scale=(0.25, 1.0), image_size=(16, 16))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """50 JPEGs and PNGs of sizes around 40x56, one shard, in a seeded order."""
    root = tmp_path_factory.mktemp("aug") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=25, size=(40, 56))
    out = str(tmp_path_factory.mktemp("aug_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


def _epochs(make, n_epochs=3):
    """{(key, epoch): image} over ``n_epochs`` epochs of batches of 10."""
    out = {}
    for epoch in range(n_epochs):
        for batch in make(epoch):
            keys = batch["key"]
            keys = keys.numpy() if hasattr(keys, "numpy") else keys
            for key, image in zip(keys, np.asarray(batch["image"])):
                key = key.decode() if isinstance(key, bytes) else str(key)
                out[(key, epoch)] = image
    return out


def test_boxes_follow_torchvision_rules_and_are_keyed():
    aug = Augment(crop=True, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=True)
    n = 2000
    keys = [f"k{i}" for i in range(n)]
    boxes = aug.boxes(7, keys, [0] * n, [0] * n, [300] * n, [400] * n)
    top, left, h, w, flip = boxes.T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= 300).all() and (left + w <= 400).all()
    area = h * w / (300 * 400)
    assert area.min() >= 0.08 - 0.01 and area.max() <= 1.0
    ratio = w / h
    assert ratio.min() >= 3 / 4 - 0.05 and ratio.max() <= 4 / 3 + 0.05
    assert 0.45 < flip.mean() < 0.55
    # the same (seed, key, epoch, view) draws the same; any change draws anew
    again = aug.boxes(7, keys[:5], [0] * 5, [0] * 5, [300] * 5, [400] * 5)
    assert (again == boxes[:5]).all()
    for changed in (
        aug.boxes(8, keys[:50], [0] * 50, [0] * 50, [300] * 50, [400] * 50),
        aug.boxes(7, keys[:50], [1] * 50, [0] * 50, [300] * 50, [400] * 50),
        aug.boxes(7, keys[:50], [0] * 50, [1] * 50, [300] * 50, [400] * 50),
    ):
        assert (changed != boxes[:50]).any(axis=1).mean() > 0.9
    # a fixed scale and ratio: the area is that fraction, up to rounding
    exact = Augment(crop=True, scale=(0.25, 0.25), ratio=(1.0, 1.0))
    h, w = exact.boxes(0, keys[:20], [0] * 20, [0] * 20, [200] * 20, [200] * 20).T[2:4]
    assert (h == 100).all() and (w == 100).all()
    # a box that cannot fit ten times: the centre crop clamped to ratio
    thin = Augment(crop=True, scale=(0.9, 1.0), ratio=(1.0, 1.0))
    box = thin.boxes(0, ["x"], [0], [0], [10], [100])[0]
    assert list(box[:4]) == [0, 45, 10, 10]
    # flips only: the whole image
    flips = Augment(flip=True).boxes(0, keys[:4], [0] * 4, [0] * 4, [9] * 4, [11] * 4)
    assert (flips[:, :4] == [0, 0, 9, 11]).all()


@pytest.mark.fast
def test_mirrored_views_pair_a_box_with_its_mirror():
    """mirror: view 2k+1 takes view 2k's box, flipped the other way; view 2k draws as
    without mirror; with no crop or flip asked for, the odd views alone are flipped."""
    n, views = 50, 6
    keys = [f"k{i}" for i in range(n) for _ in range(views)]
    args = (3, keys, [1] * len(keys), list(range(views)) * n, [60] * len(keys), [80] * len(keys))
    drawn = Augment(crop=True, flip=True).boxes(*args)
    paired = Augment(crop=True, flip=True, mirror=True).boxes(*args)
    assert (paired[0::2] == drawn[0::2]).all()
    assert (paired[1::2, :4] == paired[0::2, :4]).all()
    assert (paired[1::2, 4] == 1 - paired[0::2, 4]).all()
    assert (paired[0::6, :4] != paired[2::6, :4]).any(axis=1).mean() > 0.9  # pairs differ
    only = Augment(mirror=True).boxes(*args)
    assert (only[:, :4] == [0, 0, 60, 80]).all() and (only[:, 4] == [0, 1] * (n * 3)).all()


def test_every_reader_crops_the_same_box_and_flips_alike(mixed):
    """50 records x 3 epochs through tf.data, DALI (CPU) and the Python route: the same
    keys get the same crop and flip. The Python route is the box cut from its decode,
    exactly; tf.data and DALI agree with it within the decoders' and resizes' levels."""
    common = dict(AUG, seed=5, shuffle=False)
    python = _epochs(
        lambda e: reader.NumpyReader(
            mixed, "train", 10, num_processes=0, start_epoch=e, epochs=e + 1, **common
        )
    )
    assert len(python) == 150
    # the Python route is exactly the crop of its own decode
    aug = reader.ReadOptions(**common).augment()
    records = {k: v for k, v in _records(mixed).items()}
    for (key, epoch), image in list(python.items())[:30]:
        encoded = records[key]
        full = _decode(encoded, 3)
        top, left, h, w, flip = aug.boxes(5, [key], [epoch], [0], *[[d] for d in full.shape[:2]])[0]
        want = full[top : top + h, left : left + w]
        want = _resize(np.ascontiguousarray(want), (16, 16))
        want = want[:, ::-1] if flip else want  # resized, then flipped
        assert (image == want).all(), key
    tf_images = _epochs(
        lambda e: reader.make_dataset(mixed, "train", 10, start_epoch=e, epochs=e + 1, **common)
    )
    assert tf_images.keys() == python.keys()
    _close(tf_images, python, "tf.data")
    # with an image_size, tf.data decodes and resizes through the Python route's functions
    assert all(np.array_equal(tf_images[k], python[k]) for k in python)
    from reader import dali

    if dali.installed():
        dali_images = _epochs(
            lambda e: dali.make_dali_pipeline(
                mixed, "train", 10, device="cpu", start_epoch=e, epochs=e + 1, **common
            )
        )
        assert dali_images.keys() == python.keys()
        _close(dali_images, python, "dali")


def _records(data_dir):
    from conftest import read_split

    shards = read_split(data_dir, "train")
    return {r["image/key"].decode(): r["image/encoded"] for shard in shards for r in shard}


def _close(images: dict, python: dict, name: str):
    """Same box and flip: the mean level difference of each image under 1 (a wrong box
    or a missed flip is tens of levels on these images)."""
    diffs = [np.abs(images[k].astype(int) - python[k].astype(int)).mean() for k in python]
    print(f"{name}: mean {np.mean(diffs):.3f}, worst image {max(diffs):.3f} levels")
    assert max(diffs) < 1, (name, max(diffs))
    # the resizes' fixed-point rounding (OpenCV's 11-bit weights on the Python route)
    assert np.mean(diffs) < 0.2, (name, np.mean(diffs))


def test_augmentations_change_with_epoch_and_resume_exactly(mixed):
    common = dict(AUG, seed=1, epochs=2)
    whole = list(reader.make_dataset(mixed, "train", 10, **common))
    assert len(whole) == 10
    resumed = list(reader.make_dataset(mixed, "train", 10, start_step=3, **common))
    for a, b in zip(whole[3:], resumed):
        assert (a["key"].numpy() == b["key"].numpy()).all()
        assert (a["image"].numpy() == b["image"].numpy()).all()
    # the same key in two epochs is cropped anew
    by_key = {}
    for batch in whole:
        for key, image in zip(batch["key"].numpy(), batch["image"].numpy()):
            by_key.setdefault(key, []).append(image)
    moved = [not np.array_equal(*v) for v in by_key.values() if len(v) == 2]
    assert np.mean(moved) > 0.9


def test_augment_options_are_checked_and_part_of_the_order():
    for bad in ((0, 1), (0.5, 0.4), (0.1, 1.5), "x", (1,)):
        with pytest.raises(ValueError, match="crop_scale must be"):
            reader.ReadOptions(crop_scale=bad)
    with pytest.raises(ValueError, match="crop_ratio must be"):
        reader.ReadOptions(crop_ratio=(2, 1))
    plain = reader.ReadOptions(seed=0).order("train")
    assert "crop_scale" not in plain and "random_flip" not in plain
    cropped = reader.ReadOptions(seed=0, random_crop=True, crop_scale=(0.5, 1)).order("train")
    assert "crop_scale=0.5,1.0" in cropped
    assert "random_flip=True" in reader.ReadOptions(random_flip=True).order("train")
    assert math.isclose(reader.ReadOptions().crop_ratio[1], 4 / 3)


def test_a_path_records_image_of_another_size_than_converted_is_named(tmp_path):
    """A path record's file replaced since convert by an image of another size: the box
    was drawn for the stored size, so tf.data stops naming the file, not a wrong box."""
    from PIL import Image

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=1, per_label=6, formats=("png", "jpeg"))
    out = str(tmp_path / "paths")
    write_dataset(str(root), out, "--splits=train=1.0", "--record_kind=path")
    victim = sorted(p for p in (root / "label_0").iterdir())[0]
    fmt = "JPEG" if victim.suffix in (".jpg", ".jpeg") else "PNG"
    Image.new("RGB", (5, 4)).save(victim, fmt)
    ds = reader.make_dataset(out, "train", 3, seed=0, **AUG)
    with pytest.raises(Exception, match=f"image.*{victim.name}.*when converted"):
        list(ds)
