"""The worker's records in read-plan order, fetched by offset, without TensorFlow.

The DALI pipeline and the PyTorch iterable read through here: the same
:class:`reader.worker.WorkerRead` as ``make_dataset`` (files, counts, order,
batches across epoch boundaries, padding, ``start_step``), with records
fetched by their offsets in the DALI index convert writes beside each
uncompressed shard, so any position is one ``pread`` away.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from reader.info import default_path_root
from reader.options import ReadOptions
from reader.worker import WorkerRead
from schemas import features, layout, storage, tfrecord
from schemas.example import parse_example
from schemas.info import DatasetError, load_info


@dataclasses.dataclass
class Batch:
    """One batch: encoded images and their records' fields, in read order.

    ``mask`` is False on padding rows (``pad_final_batch``), whose encoded
    image repeats a real one so that decoders see a valid image; their
    label is 0 and key empty, as in ``make_dataset``.
    """

    encoded: list[np.ndarray]
    label: np.ndarray
    key: list[str]
    mask: np.ndarray


class RecordSource:
    """Batches of one worker's share of a split (see the module docstring).

    Args:
        data_dir, split, batch_size, options: as for ``reader.make_dataset``
            (``image_size`` and the like are the decoder's business).

    Raises:
        DatasetError: as ``make_dataset``; also for gzip-compressed shards
            (no index: convert without ``--compression gzip``) and for
            datasets outside the local file system.
    """

    def __init__(self, data_dir: str, split: str, batch_size: int, options: ReadOptions):
        info = load_info(data_dir)
        if info["compression"] != "none":
            raise DatasetError(
                f"{data_dir} has {info['compression']} shards: this reader fetches records "
                "by offset from the DALI index, which only uncompressed shards have; "
                "convert without --compression"
            )
        if storage.is_url(data_dir):
            raise DatasetError(f"{data_dir}: this reader reads local folders (use make_dataset)")
        self.info, self.options, self.batch_size = info, options, batch_size
        self.read = WorkerRead.of(info, data_dir, split, batch_size, options)
        self.kind = info["record_kind"]
        self.root = default_path_root(info, options.path_root)
        self._paths = [s["path"] for s in self.read.shards]
        self._offsets = [s["table"][:, 0] for s in self.read.shards]
        self._sizes = [s["table"][:, 1] for s in self.read.shards]
        counts = [s["num_examples"] for s in self.read.shards]
        self._firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._fds: list[int] = []

    def __len__(self) -> int:
        if self.read.remaining is None:
            raise TypeError("an endless read (epochs=None) has no length")
        return self.read.remaining

    def __iter__(self):
        """Batches from ``start_step`` on, as ``make_dataset`` yields them."""
        o, size = self.options, self.batch_size
        plan, n = self.read.plan, self.read.num_examples
        epoch, position = divmod(self.read.start, n)
        left = self.read.remaining
        pending: list[tuple] = []
        self._fds = [os.open(p, os.O_RDONLY) for p in self._paths]
        try:
            while (o.epochs is None or epoch < o.epochs) and left != 0:
                for gid in plan.epoch_order(epoch)[position:]:
                    pending.append(self._example(int(gid)))
                    if len(pending) == size:
                        yield self._batch(pending, size)
                        pending, left = [], None if left is None else left - 1
                        if left == 0:
                            return
                epoch, position = epoch + 1, 0
            if pending and not o.drop_remainder:
                yield self._batch(pending, size if o.pad_final_batch else len(pending))
                left -= 1
            while o.pad_final_batch and left > 0:  # all-padding batches, as every worker
                yield self._batch([], size, like=self._example(0))
                left -= 1
        finally:
            for fd in self._fds:
                os.close(fd)
            self._fds = []

    def _example(self, gid: int) -> tuple:
        """(encoded image, label, key) of the worker's record ``gid``."""
        f = int(np.searchsorted(self._firsts, gid, side="right")) - 1
        r = gid - int(self._firsts[f])
        offset, size = int(self._offsets[f][r]), int(self._sizes[f][r])
        try:
            data = tfrecord.unframe(os.pread(self._fds[f], size, offset), self._paths[f], r, offset)
        except tfrecord.CorruptRecord as e:
            raise DatasetError(f"{e}: the shard is corrupt or truncated") from None
        ex = parse_example(data)
        if self.kind == "image":
            encoded = ex[features.ENCODED]
        else:
            encoded = storage.read_bytes(layout.join(self.root, ex[features.PATH].decode()))
        return (
            np.frombuffer(eight_bit_png(encoded), np.uint8),
            ex[features.LABEL],
            ex[features.KEY].decode(),
        )

    @staticmethod
    def _batch(rows: list[tuple], size: int, like: tuple | None = None) -> Batch:
        real = len(rows)
        filler = rows[0] if rows else like
        rows = rows + [(filler[0], 0, "")] * (size - real)
        return Batch(
            encoded=[r[0] for r in rows],
            label=np.array([r[1] for r in rows], np.int64),
            key=[r[2] for r in rows],
            mask=np.arange(size) < real,
        )


def eight_bit_png(encoded: bytes) -> bytes:
    """A 16-bit PNG as the 8-bit PNG of its samples' high bytes; any other image as is.

    The readers' rule for 16-bit samples is libpng's strip, the high byte
    (TensorFlow); DALI rounds instead (off by 1 on a quarter of the samples),
    and asking DALI for 16-bit output halved its decode rate for every image.
    16-bit PNGs are rare: they alone are rewritten here, with Pillow and numpy.
    """
    if encoded[:8] != b"\x89PNG\r\n\x1a\n" or len(encoded) < 26 or encoded[24] != 16:
        return encoded
    import io

    from PIL import Image

    color_type = encoded[25]
    with Image.open(io.BytesIO(encoded)) as im:
        im.load()
        if color_type == 0:  # gray: Pillow keeps 16 bits (I;16)
            out = Image.fromarray((np.asarray(im, np.uint16) >> 8).astype(np.uint8), "L")
        elif color_type == 4:  # gray+alpha: Pillow gives RGBA of the high bytes
            rgba = np.asarray(im.convert("RGBA"))
            out = Image.fromarray(np.ascontiguousarray(rgba[..., [0, 3]]), "LA")
        else:  # RGB, RGBA: Pillow unpacks the high bytes
            out = im.copy()
    buffer = io.BytesIO()
    out.save(buffer, "PNG", compress_level=0)
    return buffer.getvalue()
