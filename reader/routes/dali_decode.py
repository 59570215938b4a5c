"""The DALI decode stage: a :class:`reader.records.source.RecordSource`'s batches decoded,
cropped and resized by an NVIDIA DALI pipeline (nvJPEG on the GPU when there is one).

The spine's DALI decode, which ``make_dali_pipeline`` and ``TorchReader(backend="dali")``
both stand on. DALI decodes with the readers' decoding rules (docs/convert.md#decoding).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from reader.decode.pydecode import image_shape
from reader.records.example_batches import refuse
from reader.records.source import Batch, RecordSource
from reader.values.option_groups import GROUPS, refuse_untaken
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas.dataset_info import DatasetInfo
from schemas.errors import InvalidValueError
from schemas.images import DALI_FORMATS
from schemas.info import DatasetError

# the groups of options the DALI reader takes (reader/values/option_groups.py)
TAKES = frozenset(GROUPS) - {"form", "tuning", "device"}
INSTEAD = {
    "form": "its batches are dicts (batch['image'], batch['label'])",
    "tuning": "it prefetches 2 batches to where it decodes, and its threads are num_threads=",
    "device": "it decodes where device= says (the GPU: nvJPEG)",
}


class DaliReader:
    """A built DALI pipeline and the records that feed it; iterate for batches.

    Each batch is a dict: ``image`` (uint8, NHWC; a DALI ``TensorListGPU``
    on the GPU, a numpy array on the CPU), ``label`` (int64), ``key`` (list of
    str), ``mask`` (bool: False on padding, whose image is zeros).
    ``pipeline`` is the DALI pipeline itself (its external source, named
    "encoded", pulls the encoded images; out come the images), ``len()`` the
    number of batches. Iterating again starts the read again. ``state_dict()`` and
    ``load_state_dict()`` save and resume the read as every face's do (torchdata's
    names); ``state`` is the state the read starts from.
    """

    def __init__(self, source: RecordSource, device: str):
        self.source, self.device = source, device
        self.state = source.read.state  # the state the read starts from
        self._consumed = 0  # batches this iteration yielded
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
        self._consumed = 0
        while True:
            try:
                (images,) = self.pipeline.run()
            except StopIteration:
                return
            except RuntimeError as e:
                if "decoders.image" not in str(e):
                    raise
                raise _undecodable(e, self._fed) from None
            out = self._output(images, self._fed.popleft())
            self._consumed += 1
            yield out

    def state_dict(self) -> dict:
        """Where this read stands: ``{"read_state": ReadState JSON}``, advanced by the
        batches this iteration yielded (not those DALI decoded ahead)."""
        return {"read_state": self.state.advance(self._consumed).to_json()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continues the read ``state_dict`` saved (any worker count: the ranks of this
        run read what the saved ones left, each record once) at the next iteration."""
        if not isinstance(state_dict, dict) or "read_state" not in state_dict:
            got = "no read_state" if isinstance(state_dict, dict) else type(state_dict).__name__
            raise InvalidValueError(
                f"not a reader state ({got}): load_state_dict takes a dict as state_dict() gives it"
            )
        data_dir, split, batch_size, options = self.source.made_with
        options = dataclasses.replace(options, start_epoch=0, start_step=0)
        saved = ReadState.from_json(state_dict["read_state"])
        self.source = RecordSource(data_dir, split, batch_size, options, saved)
        self.state, self._consumed = self.source.read.state, 0

    def _output(self, images, batch: Batch) -> dict:
        if self.device == "gpu":
            image = images  # TensorListGPU: reader.torch moves it into a torch tensor
        else:
            image = images.as_array()
            if not batch.mask.all():
                image = image.copy()
                image[~batch.mask] = 0
        return {"image": image, "label": batch.label, "key": batch.key, "mask": batch.mask}


class UndecodableError(DatasetError, RuntimeError):
    """DALI's decoder failed an image: a ``DatasetError`` naming it, and still the
    ``RuntimeError`` DALI raised (an ``except RuntimeError`` catches it as before)."""


def _undecodable(error: RuntimeError, fed) -> DatasetError:
    """One line for DALI's decoder failing a batch (its message names no image): the
    keys whose images Python cannot decode either, among the batches fed to it."""
    from reader.decode import pixels

    bad = []
    for batch in fed:
        for encoded, key, real in zip(batch.encoded, batch.key, batch.mask):
            try:
                pixels.decode(bytes(encoded), 3)
            except Exception:  # noqa: BLE001 - a damaged image fails in many ways
                bad.append(key if real else "(a padding row)")
    said = [line for line in str(error).splitlines() if "failure" in line or "rror" in line]
    return UndecodableError(
        f"DALI could not decode the image of {', '.join(map(repr, bad)) or 'a batch'} "
        f'({said[-1].strip() if said else "its decoder failed"}): on_error="skip" skips '
        'such an image on the Python route (NumpyReader, TorchReader(backend="python")); '
        "or convert the shards again"
    )


def modules() -> tuple:
    """DALI's ``(dali, fn, types)`` modules; an ``ImportError`` saying how to install it."""
    try:
        from nvidia import dali
        from nvidia.dali import fn, types
    except ImportError as e:
        raise ImportError(f'DALI is not installed: pip install "evenshard[dali]" ({e})') from None
    return dali, fn, types


def build(source: RecordSource, device: str | None = None, num_threads: int = 2) -> DaliReader:
    """A built DALI pipeline over ``source`` (its options checked by ``check_options``,
    its datasets by ``check_formats``): ``device`` "gpu", "cpu" or None (the GPU when
    DALI sees one).

    Raises:
        ImportError: DALI is not installed (``pip install "evenshard[dali]"``).
    """
    dali, fn, types = modules()
    o, batch_size = source.options, source.batch_size
    if device is None:
        device = "gpu" if _gpus() else "cpu"
    if device not in ("gpu", "cpu"):
        raise InvalidValueError(f'device must be "gpu", "cpu" or None, got {device!r}')
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
        raise InvalidValueError("make_dali_pipeline decodes and batches images: give image_size")
    if o.deterministic is False:
        raise InvalidValueError(
            "the DALI reader always reads in its one order: leave deterministic"
        )
    refuse_untaken(o, TAKES, "the DALI reader", INSTEAD)
    if o.channels not in (1, 3):
        raise InvalidValueError(f"DALI decodes to 1 or 3 channels, got channels={o.channels}")


def check_formats(data_dir: str, info: DatasetInfo) -> None:
    """A dataset holding a format DALI does not decode (GIF) is refused, and one of
    records that are not images."""
    refuse(data_dir, info, "DALI")
    unsupported = sorted(set(info.formats) - set(DALI_FORMATS))
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
