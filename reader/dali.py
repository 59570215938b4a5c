"""NVIDIA DALI pipelines over a split: decoding on the GPU (nvJPEG) when there is one.

``make_dali_pipeline`` feeds DALI from :class:`reader.source.RecordSource`,
so it reads exactly what ``reader.make_dataset`` reads, in the same order
(the same files per worker, equal counts, the seeded order that changes
every epoch, batches across epoch boundaries, ``start_step``, padding and
mask), and DALI decodes, crops and resizes: ``device="gpu"`` decodes with
``"mixed"`` (nvJPEG), ``"cpu"`` on the CPU.

Why not DALI's own ``fn.readers.tfrecord``: its shuffle is a buffer of its
own and its sharding splits records, not files, so it could not promise the
reader's order, exact-once padding or resuming. The DALI index files that
convert writes serve both: this reader fetches records by their offsets, and
``fn.readers.tfrecord(index_path=...)`` takes them as they are.
"""

from __future__ import annotations

import collections

import numpy as np

from reader.options import ReadOptions
from reader.pydecode import image_shape
from reader.read import merge
from reader.source import Batch, RecordSource
from schemas.images import DALI_FORMATS
from schemas.info import DatasetError


class DaliReader:
    """A built DALI pipeline and the records that feed it; iterate for batches.

    Each batch is a dict: ``image`` (uint8, NHWC; a DALI ``TensorListGPU``
    on the GPU, a numpy array on the CPU), ``label`` (int64), ``key`` (list of
    str), ``mask`` (bool: False on padding, whose image is zeros).
    ``pipeline`` is the DALI pipeline itself (its external source, named
    "encoded", pulls the encoded images; out come the images), ``len()`` the
    number of batches. Iterating again starts the read again.
    """

    def __init__(self, source: RecordSource, device: str):
        self.source, self.device = source, device
        self.state = source.read.state  # given a state: the one to advance
        self.pipeline = None  # built by make_dali_pipeline
        self._batches = iter(())
        self._fed: collections.deque[Batch] = collections.deque()
        self._fresh = True
        self.augment, self.seed = None, 0  # set by make_dali_pipeline

    def __len__(self) -> int:
        return len(self.source)

    def _next_encoded(self):
        """The external source: DALI calls it from its own thread, ahead of the runs
        (prefetch), so Python fetches the next batch while DALI decodes this one.
        StopIteration ends DALI's epoch."""
        batch = next(self._batches)
        self._fed.append(batch)  # runs come out in the order batches went in
        return batch.encoded

    def _next_augmented(self):
        """The external source with augmentations: each batch's encoded images, their
        crop anchors (x, y) and shapes (width, height), and flips, as every reader
        draws them (``reader/order/augment.py``)."""
        encoded = self._next_encoded()
        batch = self._fed[-1]
        shapes = np.array([image_shape(e) for e in batch.encoded], np.int64).reshape(-1, 2)
        views = np.zeros(len(batch.key), np.int64)
        boxes = self.augment.boxes(
            self.seed, batch.key, batch.epoch, views, shapes[:, 0], shapes[:, 1]
        ).astype(np.int32)
        anchors = np.ascontiguousarray(boxes[:, [1, 0]])
        sizes = np.ascontiguousarray(boxes[:, [3, 2]])
        flips = np.ascontiguousarray(boxes[:, 4])
        return encoded, anchors, sizes, flips

    def __iter__(self):
        if not self._fresh:
            self.pipeline.reset()
        self._fresh = False
        self._fed.clear()
        self._batches = iter(self.source)
        while True:
            try:
                (images,) = self.pipeline.run()
            except StopIteration:
                return
            yield self._output(images, self._fed.popleft())

    def _output(self, images, batch: Batch) -> dict:
        if self.device == "gpu":
            image = images  # TensorListGPU: reader.torch moves it into a torch tensor
        else:
            image = images.as_array()
            if not batch.mask.all():
                image = image.copy()
                image[~batch.mask] = 0
        return {"image": image, "label": batch.label, "key": batch.key, "mask": batch.mask}


def make_dali_pipeline(
    data_dir,
    split: str = "train",
    batch_size: int = 32,
    options: ReadOptions | None = None,
    *,
    device: str | None = None,
    num_threads: int = 2,
    state=None,
    **overrides,
) -> DaliReader:
    """A DALI pipeline over one split, with the reader's semantics.

    Args:
        data_dir, split, batch_size, options, overrides: as for
            ``reader.make_dataset`` (``data_dir`` may be a ``reader.mix``;
            ``image_size`` is required: DALI batches
            images of one size; ``channels`` 1 or 3; ``random_crop`` and
            ``random_flip`` draw the boxes and flips every reader draws).
        device: "gpu" (decode with nvJPEG: DALI's "mixed"), "cpu", or None:
            the GPU when DALI sees one.
        num_threads: DALI's CPU threads.
        state: a :class:`reader.ReadState` to resume (any worker count); the
            reader's ``state`` is then the state to advance by the batches consumed.

    Raises:
        DatasetError: the dataset holds a format DALI does not decode (GIF),
            or has no DALI index (gzip shards).
        ImportError: DALI is not installed (``pip install "evenshard[dali]"``).
    """
    try:
        from nvidia import dali
        from nvidia.dali import fn, types
    except ImportError as e:
        raise ImportError(f'DALI is not installed: pip install "evenshard[dali]" ({e})') from None
    o = merge(options, overrides)
    check_options(o)
    source = RecordSource(data_dir, split, batch_size, o, state)
    for part in source.read.sources:
        check_formats(part.data_dir, part.info)
    if device is None:
        device = "gpu" if _gpus() else "cpu"
    if device not in ("gpu", "cpu"):
        raise ValueError(f'device must be "gpu", "cpu" or None, got {device!r}')
    decoder_device = "mixed" if device == "gpu" else "cpu"
    seed = source.read.seed if source.read.seed is not None else 0

    reader = DaliReader(source, device)
    reader.augment, reader.seed = o.augment(), seed

    @dali.pipeline_def(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=0 if device == "gpu" else None,
        seed=seed % (2**31),
        prefetch_queue_depth=2,
    )
    def pipeline():
        # A smaller final batch passes as is: DALI runs batches of any size
        # up to batch_size.
        if reader.augment is None:
            encoded = fn.external_source(
                source=reader._next_encoded, batch=True, dtype=types.UINT8, name="encoded"
            )
        else:
            encoded, anchors, sizes, flips = fn.external_source(
                source=reader._next_augmented,
                batch=True,
                num_outputs=4,
                dtype=[types.UINT8, types.INT32, types.INT32, types.INT32],
            )
        kind = types.RGB if o.channels == 3 else types.GRAY
        # The readers' decoding rules (docs/convert.md#decoding): EXIF
        # orientation is not applied and JPEG chroma is upsampled as libjpeg
        # does. (16-bit PNGs come 8-bit from the record source already.)
        rules = dict(
            device=decoder_device,
            output_type=kind,
            adjust_orientation=False,
            jpeg_fancy_upsampling=True,
        )
        if reader.augment is None:
            images = fn.decoders.image(encoded, **rules)
        else:  # the box every reader draws; a JPEG decodes only the box
            images = fn.decoders.image_slice(
                encoded,
                anchors,
                sizes,
                axis_names="WH",
                normalized_anchor=False,
                normalized_shape=False,
                **rules,
            )
            images = fn.flip(images, horizontal=flips)
        height, width = o.image_size
        return fn.resize(images, resize_y=height, resize_x=width, antialias=False)

    reader.pipeline = pipeline()
    reader.pipeline.build()
    return reader


def check_options(o: ReadOptions) -> None:
    """Options DALI cannot honour: a ``ValueError`` naming the option."""
    if o.image_size is None or not o.decode:
        raise ValueError("make_dali_pipeline decodes and batches images: give image_size")
    if o.deterministic is False:
        raise ValueError("the DALI reader always reads in its one order: leave deterministic")
    o.refuse(
        ("as_supervised", "cache", "prefetch", "prefetch_to_device", "num_parallel_calls"),
        "the DALI reader",
        "its batches are dicts (batch['image'], batch['label']), it prefetches 2 batches "
        "to where it decodes (device=), and its threads are num_threads=",
    )
    if o.channels not in (1, 3):
        raise ValueError(f"DALI decodes to 1 or 3 channels, got channels={o.channels}")


def check_formats(data_dir: str, info: dict) -> None:
    """A dataset holding a format DALI does not decode (GIF) is refused."""
    unsupported = sorted(set(info.get("formats", [])) - set(DALI_FORMATS))
    if unsupported:
        raise DatasetError(
            f"{data_dir} holds {', '.join(unsupported)} images, which DALI cannot decode "
            f"(it reads {', '.join(DALI_FORMATS)}): read it with reader.make_dataset, or "
            "convert the images to PNG or JPEG first"
        )


def installed() -> bool:
    """Whether DALI can be imported."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def feed_ndarray(tensor, out, cuda_stream) -> None:
    """Copies a DALI tensor into a torch CUDA tensor ``out`` on ``cuda_stream``."""
    from nvidia.dali.plugin.pytorch import feed_ndarray as feed

    feed(tensor, out, cuda_stream=cuda_stream)


def _gpus() -> int:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no GPU
        return 0


__all__ = ["DaliReader", "make_dali_pipeline"]
