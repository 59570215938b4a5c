"""The transforms test_preprocess.py and test_reader.py send to worker processes.

A transform is pickled by reference: each worker process imports the module that
defines it. In a test file that import took Beam (through dataset_writer), pytest and
(test_reader.py) TensorFlow with it, 2-8 CPU-s a process and about 20 pools in
test_preprocess.py; this module imports numpy only, which the fork server has already
imported.
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


def flip(example, rng):
    return {"image": example["image"][:, ::-1], "label": example["label"]}
