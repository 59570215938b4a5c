"""One write or one read of one tool, for ``peers_bench.py``, in a process of its own.

    python _peers_worker.py write TOOL SRC OUT RESULT_JSON
    python _peers_worker.py read TOOL DATA COUNT          # JSON on the last line of stdout

The peers (WebDataset, ArrayRecord + Grain, LitData, MosaicML Streaming, torchvision)
run with the peers' own virtual environment's python, evenshard and plain tf.data with
the project's: nothing here is imported at the top but the standard library and numpy,
so one file serves both. Every writer is fed the label-sorted listing of the source
folder (``label_NNN/img_IIIIII.jpg``: IIIIII is the image's index in that listing) and
stores the index beside the label; every reader decodes and resizes to 224x224 in
batches of 128 with its own shuffle and returns the indices and labels of each batch,
so that the bench checks every image was read exactly once and measures the label mix.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _peers_io import BATCH, SIZE, TF_SHUFFLE, WORKERS, index_of, listing  # noqa: E402
from _peers_readers import (  # noqa: E402
    read_grain,
    read_litdata,
    read_mds,
    read_torchvision,
    read_torchvision_pil,
    read_webdataset,
)
from _peers_writers import WRITERS, fresh  # noqa: E402

# ------------------------------------------------------------------------------ reads


def read_evenshard_tf(data: str):
    """``reader.make_dataset`` (tf.data; its own parallelism, AUTOTUNE)."""
    import reader

    ds = reader.make_dataset(data, "train", BATCH, seed=0, epochs=1, image_size=SIZE)
    for b in ds:
        yield b["image"].numpy(), b["label"].numpy(), [k.decode() for k in b["key"].numpy()]


def _torch_reader(data: str, backend: str | None, info: dict):
    from reader.torch import TorchReader

    r = TorchReader(data, "train", BATCH, backend=backend, seed=0, epochs=1, image_size=SIZE)
    for b in r:
        yield b["image"], b["label"], b["key"]
    info["backend"] = r.backend


def read_evenshard_torch(data: str, info: dict):
    """``TorchReader`` with its default backend, iterated directly."""
    return _torch_reader(data, None, info)


def read_evenshard_torch_tf(data: str, info: dict):
    """``TorchReader(backend="tf")``, iterated directly."""
    return _torch_reader(data, "tf", info)


def read_evenshard_torch_dali(data: str, info: dict):
    """``TorchReader(backend="dali")``: DALI on the CPU, iterated directly."""
    return _torch_reader(data, "dali", info)


def read_evenshard_numpy(data: str):
    """``reader.NumpyReader``: its decode (simplejpeg + OpenCV) in 2 worker processes."""
    import reader

    r = reader.NumpyReader(
        data, "train", BATCH, seed=0, epochs=1, image_size=SIZE, num_processes=WORKERS
    )
    for b in r:
        yield b["image"], b["label"], list(b["key"])


def read_tf_plain(data: str):
    """list_files(shuffle) -> interleave(TFRecordDataset, AUTOTUNE) -> shuffle(10000)
    -> map(parse, decode_jpeg, resize; AUTOTUNE) -> batch(128) -> prefetch(AUTOTUNE)."""
    import tensorflow as tf

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "index": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(ex["image"], channels=3)
        image = tf.cast(tf.image.resize(image, SIZE), tf.uint8)
        return image, ex["label"], ex["index"]

    files = tf.data.Dataset.list_files(os.path.join(data, "*.tfrecord"), shuffle=True, seed=0)
    ds = (
        files.interleave(
            tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False
        )
        .shuffle(TF_SHUFFLE, seed=0)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    for image, label, index in ds:
        yield image.numpy(), label.numpy(), index.numpy()


READERS = {
    "evenshard_tf": read_evenshard_tf,
    "evenshard_torch": read_evenshard_torch,
    "evenshard_torch_tf": read_evenshard_torch_tf,
    "evenshard_torch_dali": read_evenshard_torch_dali,
    "evenshard_numpy": read_evenshard_numpy,
    "tf_plain": read_tf_plain,
    "webdataset": read_webdataset,
    "grain": read_grain,
    "litdata": read_litdata,
    "mds": read_mds,
    "torchvision": read_torchvision,
    "torchvision_pil": read_torchvision_pil,
}

# The modules each reader imports, imported before its clock starts: a training job
# imports its framework once, not an epoch (TensorFlow's import alone was 4-5 s of a
# 13-17 s epoch, torch's 1-2 s). The loader is still made, and its workers started,
# inside the clock.
IMPORTS = {
    "evenshard_tf": ("reader.pipeline",),  # ``import reader`` alone is lazy
    "evenshard_torch": ("reader.torch", "reader.pipeline", "reader.dali"),
    "evenshard_torch_tf": ("reader.torch", "reader.pipeline"),
    "evenshard_torch_dali": ("reader.torch", "reader.dali"),
    "evenshard_numpy": ("reader.arrays",),
    "tf_plain": ("tensorflow",),
    "webdataset": ("torch", "webdataset"),
    "grain": ("grain",),
    "litdata": ("torch", "litdata"),
    "mds": ("torch", "streaming"),
    "torchvision": ("torch", "torchvision"),
    "torchvision_pil": ("torch", "torchvision"),
}


def _ints(values) -> list[int]:
    """Indices from keys (strings) or from an integer array or tensor."""
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    return [index_of(v) if isinstance(v, str) else int(v) for v in values]


def read(tool: str, data: str) -> dict:
    """One epoch: seconds from making the loader (its modules imported before) to its
    last batch, and every batch's indices and labels."""
    import importlib

    fn = READERS[tool]
    for module in IMPORTS[tool]:
        importlib.import_module(module)
    info: dict = {}
    start = time.perf_counter()
    batches = fn(data, info) if "info" in fn.__code__.co_varnames else fn(data)
    indices, labels, shapes = [], [], set()
    for image, label, index in batches:
        shape = tuple(image.shape)
        if len(shape) != 4 or str(image.dtype).split(".")[-1] != "uint8":
            raise RuntimeError(f"{tool}: a batch of images {shape} {image.dtype}")
        shapes.add(shape[1:])
        indices.append(_ints(index))
        labels.append(_ints(label))
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "indices": indices,
        "labels": labels,
        "image_shapes": sorted(shapes),
        **info,
    }


def main(argv: list[str]) -> None:
    mode, tool, *rest = argv
    if mode == "write":
        src, out, result = rest
        items = listing(src)
        fresh(out)
        start = time.perf_counter()
        facts = WRITERS[tool](items, out)
        seconds = time.perf_counter() - start
        size = sum(
            os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(out) for n in names
        )
        with open(result, "w") as f:
            json.dump(
                {"seconds_in_process": seconds, "bytes": size, "images": len(items), **facts}, f
            )
    elif mode == "read":
        data, count = rest
        out = read(tool, data)
        out["expected"] = int(count)
        print(json.dumps(out))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1:])
