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
import pickle
import shutil
import sys
import time

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
    """The per-image work of evenshard's Python route (``reader/preprocess.py``), given
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


def _fresh(out: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)


def _contiguous(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` runs in order, as a writing loop fills one file after another."""
    return [items[len(items) * p // parts : len(items) * (p + 1) // parts] for p in range(parts)]


# ----------------------------------------------------------------------------- writes


def write_tf_plain(items, out: str) -> dict:
    """A plain loop: tf.train.Example records through tf.io.TFRecordWriter, 16 files."""
    import tensorflow as tf

    def feature(**values):
        out = {}
        for k, v in values.items():
            if isinstance(v, bytes):
                out[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
            else:
                out[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        return tf.train.Features(feature=out)

    for s, part in enumerate(_contiguous(items, SHARDS)):
        with tf.io.TFRecordWriter(os.path.join(out, f"data-{s:05d}.tfrecord")) as w:
            for path, label, index in part:
                example = tf.train.Example(
                    features=feature(image=read_bytes(path), label=label, index=index)
                )
                w.write(example.SerializeToString())
    return {"files": SHARDS}


def write_webdataset(items, out: str) -> dict:
    """``wds.ShardWriter``: tar shards of 1,000 samples (``.jpg`` bytes, ``.cls``)."""
    import webdataset as wds

    with wds.ShardWriter(
        os.path.join(out, "shard-%06d.tar"), maxcount=WDS_MAXCOUNT, verbose=0
    ) as w:
        for path, label, index in items:
            w.write({"__key__": f"{index:06d}", "jpg": read_bytes(path), "cls": label})
    return {"files": len(os.listdir(out))}


def write_arrayrecord(items, out: str) -> dict:
    """``ArrayRecordWriter`` (``group_size:1``, for random access), 16 files, each
    record a pickled dict (the JPEG's bytes, label, index)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    for s, part in enumerate(_contiguous(items, SHARDS)):
        w = ArrayRecordWriter(os.path.join(out, f"data-{s:05d}.array_record"), "group_size:1")
        for path, label, index in part:
            w.write(pickle.dumps({"image": read_bytes(path), "label": label, "index": index}))
        w.close()
    return {"files": SHARDS}


def _lit_sample(item):
    path, label, index = item
    return {"index": index, "label": label, "image": read_bytes(path)}


def write_litdata(items, out: str) -> dict:
    """``litdata.optimize`` in 2 worker processes, chunks of 64 MB."""
    import litdata

    litdata.optimize(
        fn=_lit_sample,
        inputs=[tuple(i) for i in items],
        output_dir=out,
        chunk_bytes=LIT_CHUNK,
        num_workers=WORKERS,
        verbose=False,
    )
    return {"files": len([n for n in os.listdir(out) if n.endswith(".bin")])}


def write_mds(items, out: str) -> dict:
    """MosaicML ``MDSWriter``, its default shard size (67 MB), no compression."""
    from streaming import MDSWriter

    columns = {"image": "bytes", "label": "int", "index": "int"}
    with MDSWriter(out=out, columns=columns, progress_bar=False) as w:
        for path, label, index in items:
            w.write({"image": read_bytes(path), "label": label, "index": index})
    return {"files": len([n for n in os.listdir(out) if n.endswith(".mds")])}


WRITERS = {
    "tf_plain": write_tf_plain,
    "webdataset": write_webdataset,
    "arrayrecord": write_arrayrecord,
    "litdata": write_litdata,
    "mds": write_mds,
}


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


def _wds_sample(sample):
    return decode_resize(sample["jpg"]), int(sample["cls"]), int(sample["__key__"])


def read_webdataset(data: str):
    """``WebDataset(shardshuffle=100).shuffle(1000)``, decode + resize, ``.batched(128)``
    in the workers, ``WebLoader(batch_size=None, num_workers=2)`` (its docs' pattern)."""
    import webdataset as wds

    urls = sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".tar"))
    ds = (
        wds.WebDataset(urls, shardshuffle=100, seed=0)
        .shuffle(WDS_SHUFFLE)
        .map(_wds_sample)
        .batched(BATCH)
    )
    yield from wds.WebLoader(ds, batch_size=None, num_workers=WORKERS)


def _grain_decode():
    """A Grain ``MapTransform``: the pickled record to a dict of image, label, index
    (a class of this module's top level, so that Grain's workers can unpickle it)."""
    import grain

    global GrainDecode

    class GrainDecode(grain.transforms.Map):
        def map(self, record):
            ex = pickle.loads(record)
            return {"image": decode_resize(ex["image"]), "label": ex["label"], "index": ex["index"]}

    return GrainDecode()


def read_grain(data: str):
    """``grain.DataLoader`` over ``ArrayRecordDataSource``, ``IndexSampler(shuffle=True,
    seed=0, num_epochs=1)``, Map(decode + resize), Batch(128), ``worker_count=2``."""
    import grain

    paths = sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".array_record"))
    source = grain.sources.ArrayRecordDataSource(paths)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding(),
        shuffle=True,
        num_epochs=1,
        seed=0,
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[_grain_decode(), grain.transforms.Batch(BATCH)],
        worker_count=WORKERS,
    )
    for b in loader:
        yield b["image"], b["label"], b["index"]


def _lit_transform(item):
    return {"image": decode_resize(item["image"]), "label": item["label"], "index": item["index"]}


def read_litdata(data: str):
    """``StreamingDataset(shuffle=True, seed=0, transform=decode + resize)``,
    ``StreamingDataLoader(batch_size=128, num_workers=2)``."""
    import litdata

    ds = litdata.StreamingDataset(data, shuffle=True, seed=0, transform=_lit_transform)
    for b in litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS):
        yield b["image"], b["label"], b["index"]


def read_mds(data: str):
    """MosaicML ``StreamingDataset(local=..., shuffle=True, shuffle_seed=0,
    batch_size=128)`` (its default shuffle, py1e), decode + resize in ``__getitem__``,
    ``DataLoader(batch_size=128, num_workers=2)``."""
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            ex = super().__getitem__(i)
            return decode_resize(ex["image"]), ex["label"], ex["index"]

    ds = Decoded(local=data, shuffle=True, shuffle_seed=0, batch_size=BATCH)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    yield from loader


def _torchvision(data: str, loader=None, transform=None):
    import torch
    from torchvision import datasets

    class Indexed(datasets.ImageFolder):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return image, label, index_of(self.samples[i][0])

    kwargs = {"loader": loader} if loader else {}
    ds = Indexed(data, transform=transform, **kwargs)
    yield from torch.utils.data.DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        generator=torch.Generator().manual_seed(0),
    )


def read_torchvision(data: str):
    """``ImageFolder(loader=decode_resize_file)`` over the JPEG folders,
    ``DataLoader(batch_size=128, shuffle=True, num_workers=2)``."""
    return _torchvision(data, loader=decode_resize_file)


def read_torchvision_pil(data: str):
    """The same with ImageFolder's own loader (Pillow) and the transforms of its docs:
    ``Resize((224, 224))`` (Pillow's bilinear, antialiased) and ``PILToTensor``."""
    from torchvision import transforms

    tf = transforms.Compose([transforms.Resize(SIZE), transforms.PILToTensor()])
    return _torchvision(data, transform=tf)


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
        _fresh(out)
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
