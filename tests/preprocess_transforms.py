"""The transforms test_preprocess.py sends to worker processes.

A transform is pickled by reference: each worker process imports the module that
defines it. In test_preprocess.py that import took Beam (through dataset_writer) and
pytest with it, 2-3 CPU-s a process and about 20 pools in the file; this module
imports numpy only, which the fork server has already imported.
"""

from __future__ import annotations

import os
import signal

import numpy as np


def augment(example, rng):
    """Flip half the time and add noise: every byte depends on the rng."""
    draw = rng.random()
    image = example["image"][:, ::-1] if draw < 0.5 else example["image"]
    noise = rng.integers(0, 4, size=image.shape, dtype=np.uint8)
    return {**example, "image": image + noise, "flip": draw, "meta": {"k": 1}}


def fails_on_one(example, rng):
    if example["key"].endswith("img_00003.png"):
        raise ValueError("no good\nsecond line")
    return example


def dies_on_one(example, rng):
    if example["key"].endswith("img_00003.png"):
        os.kill(os.getpid(), signal.SIGKILL)
    return example


def tag_one(example, rng):
    return {**example, "tag": 1}


def tag_two(example, rng):
    return {**example, "tag": 2}


def unsendable(example, rng):
    return {**example, "bad": lambda: None}


def ragged(example, rng):
    return {**example, "ragged": np.full((1 + int(rng.integers(3)), 2), 7, np.uint8)}


def ragged_object(example, rng):
    return {**ragged(example, rng), "bad": np.array([None, lambda: None], dtype=object)[1:]}


def plain(example, rng):
    """A transform of arrays only (make_dataset yields tensors)."""
    return {"image": example["image"], "label": example["label"], "draw": rng.random()}
