"""What every tool of ``peers_bench.py`` shares, in the peers' environment and the
project's alike (the standard library and numpy at the top): the settings, the listing
the writers are fed, and the per-image decode + resize every Python reader is given.
"""

from __future__ import annotations

import os

import numpy as np

SIZE = (224, 224)  # height, width
BATCH = 128
WORKERS = 2  # DataLoader / Grain worker processes: one a core
SHARDS = 16  # files written by the plain TFRecord and ArrayRecord loops
WDS_MAXCOUNT = 1000  # samples a WebDataset tar shard
WDS_SHUFFLE = 1000  # WebDataset's sample shuffle buffer (its docs' example)
TF_SHUFFLE = 10_000  # the plain tf.data pipeline's shuffle buffer
LIT_CHUNK = "64MB"  # LitData's chunk size (its docs' example)


def listing(src: str) -> list[tuple[str, int, int]]:
    """(path, label, index) of every image, label-sorted, as the writers are fed."""
    out = []
    for folder in sorted(os.listdir(src)):
        d = os.path.join(src, folder)
        if os.path.isdir(d):
            label = int(folder.split("_")[-1])
            for name in sorted(os.listdir(d)):
                out.append((os.path.join(d, name), label, index_of(name)))
    return out


def index_of(key: str) -> int:
    """The index in ``img_IIIIII.jpg`` (a path, key or name)."""
    return int(os.path.basename(key).split("_")[-1].split(".")[0])


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def decode_resize(data: bytes) -> np.ndarray:
    """The per-image work of evenshard's Python route (``reader/routes/preprocess.py``), given
    to every Python reader alike: libjpeg-turbo through simplejpeg (accurate IDCT,
    fancy upsampling: Pillow's pixels in a third of its time), then OpenCV's bilinear
    resize to 224x224 on one thread (no antialiasing, as ``tf.image.resize``)."""
    import cv2
    import simplejpeg

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)
    image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)
    return cv2.resize(image, (SIZE[1], SIZE[0]), interpolation=cv2.INTER_LINEAR)


def decode_resize_file(path: str) -> np.ndarray:
    """``decode_resize`` of a file: an ``ImageFolder`` loader."""
    return decode_resize(read_bytes(path))
