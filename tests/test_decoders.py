"""Every reader reads the same pixels, and the record's channels are the decoder's.

The matrix (tests/image_matrix.py): PNG in every colour type and bit depth
(palette with and without tRNS, 16-bit gray+alpha, interlaced, gAMA), JPEG
(4:2:0, 4:4:4, progressive, gray, CMYK, EXIF orientation), GIF (transparent,
animated), BMP 24/32, WebP (lossless, alpha, lossy). Each reader's pixels
are compared with one reference decode: lossless exactly, lossy within 1.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import read_split, run_convert
from image_matrix import H, W, build

import reader
from audit.validate import validate
from reader.dali import make_dali_pipeline
from reader.torch import TorchReader


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    base = tmp_path_factory.mktemp("matrix")
    cases = build(str(base / "img"))
    out = str(base / "out")
    info = run_convert(str(base / "img"), out, "--splits=all=1.0", "--num_shards=2")
    assert info["rejects"]["total"] == 0 and info["inputs"] == len(cases)
    # DALI has no GIF decoder: the same matrix without GIFs for it
    shutil.rmtree(base / "img" / "gif")
    out_dali = str(base / "out_dali")
    run_convert(str(base / "img"), out_dali, "--splits=all=1.0", "--num_shards=2")
    return cases, out, out_dali


def test_recorded_channels_are_what_the_decoder_gives(matrix):
    cases, out, _ = matrix
    records = [r for shard in read_split(out, "all") for r in shard]
    assert len(records) == len(cases)
    for r in records:
        key = r["image/key"].decode()
        decoded = tf.io.decode_image(r["image/encoded"], channels=0, expand_animations=False)
        assert r["image/channels"] == decoded.shape[-1] == cases[key].channels, key
        assert (r["image/height"], r["image/width"]) == tuple(decoded.shape[:2]) == (H, W), key


def test_a_fresh_convert_of_the_matrix_passes_validate_full(matrix):
    _, out, out_dali = matrix
    assert validate(out, full=True) == []
    assert validate(out_dali, full=True) == []


def _pixels(name: str, data_dir: str) -> dict[str, np.ndarray]:
    kw = dict(image_size=(H, W), shuffle=False)
    if name == "tf":
        batches = [
            {"key": [k.decode() for k in b["key"]], "image": b["image"]}
            for b in reader.make_dataset(data_dir, "all", 16, **kw).as_numpy_iterator()
        ]
    elif name == "dali":
        batches = list(make_dali_pipeline(data_dir, "all", 16, **kw))
    elif name == "python":  # NumpyReader: libjpeg-turbo (simplejpeg) and Pillow
        batches = list(reader.NumpyReader(data_dir, "all", 16, num_processes=0, **kw))
    else:
        batches = list(TorchReader(data_dir, "all", 16, backend=name.split("-")[1], **kw))
    return {k: np.asarray(im) for b in batches for k, im in zip(b["key"], b["image"])}


@pytest.mark.parametrize("name", ["tf", "torch-tf", "dali", "torch-dali", "python"])
def test_every_reader_reads_the_reference_pixels(matrix, name):
    cases, out, out_dali = matrix
    data_dir = out_dali if "dali" in name else out
    got = _pixels(name, data_dir)
    want = {k: c for k, c in cases.items() if "dali" not in name or not k.startswith("gif/")}
    assert sorted(got) == sorted(want)
    wrong = []
    for key, case in want.items():
        diff = np.abs(got[key].astype(int) - case.reference.astype(int))
        if diff.max() > (1 if case.lossy else 0):
            wrong.append((key, int(diff.max()), round(float(diff.mean()), 2)))
    assert not wrong, (name, wrong)
