"""The peers' readers for ``peers_bench.py`` (WebDataset, Grain, LitData, MosaicML
Streaming, torchvision), run with the peers' virtual environment's python: each
decodes and resizes with ``_peers_io.decode_resize`` in batches of 128 with its own
shuffle, and yields (images, labels, indices) a batch."""

from __future__ import annotations

import os
import pickle

from _peers_io import BATCH, SIZE, WDS_SHUFFLE, WORKERS, decode_resize, decode_resize_file, index_of


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
