"""NVIDIA DALI pipelines over a split: decoding on the GPU (nvJPEG) when there is one.

``make_dali_pipeline`` feeds DALI from :class:`reader.records.source.RecordSource`,
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

from reader.front.read import merge, start_state
from reader.records.example_batches import refuse_examples
from reader.records.source import RecordSource
from reader.routes.dali_decode import (
    DaliReader,
    build,
    check_formats,
    check_options,
    installed,
    modules,
)
from reader.values.read_options import ReadOptions


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
        state: a :class:`reader.ReadState` to resume (any worker count); or, as on
            every face, the reader's ``load_state_dict(saved)`` with what its
            ``state_dict()`` gave (``state``: the state the read starts from).

    Raises:
        DatasetError: the dataset holds a format DALI does not decode (GIF),
            or has no DALI index (gzip shards).
        ImportError: DALI is not installed (``pip install "evenshard[dali]"``).
    """
    modules()  # DALI installed, said first
    options = merge(options, overrides)
    refuse_examples(data_dir, "make_dali_pipeline")  # DALI decodes images
    check_options(options)
    if state is None:  # the read as a state from its start: state_dict() says where
        state, options = start_state(options, split, batch_size)
    source = RecordSource(data_dir, split, batch_size, options, state)
    for part in source.read.sources:
        check_formats(part.data_dir, part.info)
    return build(source, device, num_threads)


__all__ = ["DaliReader", "check_formats", "installed", "make_dali_pipeline"]
