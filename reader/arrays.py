"""Batches of numpy arrays, for JAX and plain Python: ``NumpyReader``, with a Python
transform run in worker processes (``reader.preprocess``).

    from reader import NumpyReader

    def augment(example, rng):          # at the top level of a module: it is pickled
        image = example["image"]        # uint8 HWC, decoded once
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return {**example, "image": image}

    train = NumpyReader("out/", "train", 256, transform=augment, image_size=(224, 224),
                        seed=0, epochs=None, num_processes=8)
    for batch in train:                 # {"image", "label", "key", "view", "epoch", "mask"}
        ...
"""

from __future__ import annotations

from reader.options import ReadOptions
from reader.preprocess import Preprocess, check_transform, default_processes
from reader.read import merge, start_state
from reader.source import RecordSource
from reader.state import ReadState


class NumpyReader:
    """Batches of one split as dicts of numpy arrays; ``len()`` is the number of batches.

    The records are read in the reader's one order (the same as ``make_dataset`` and
    ``TorchReader`` for the same options), decoded once each with Pillow in worker
    processes, and given to ``transform`` once a view.

    Args:
        data_dir, split, batch_size, options, overrides: as for ``reader.make_dataset``
            (``data_dir`` may be a ``reader.mix``); ``image_size``: an output ``image``
            array is resized to it (bilinear), so that the batch stacks.
        transform: ``fn(example, rng) -> dict`` (None: decode only). ``example`` holds
            ``image`` (uint8 HWC), ``label``, ``key``, ``epoch`` and ``view``; ``rng`` is
            a ``numpy.random.Generator`` seeded by (seed, key, epoch, view), so the output
            is the same for any ``num_processes`` and after any resume. Output values
            that are arrays of one shape (or numbers) are stacked; others come as lists.
        views: transformed views of each decoded image, consecutive in the batch
            (``batch_size`` a multiple of it: the views of an image share a batch).
        num_processes: worker processes (default: the cores; 0: in this process).
        state: a :class:`reader.ReadState` to resume (any worker count).

    Raises:
        TypeError: a transform that cannot be sent to worker processes (a lambda).
        ValueError, DatasetError: as ``make_dataset``.
    """

    def __init__(
        self,
        data_dir,
        split: str = "train",
        batch_size: int = 32,
        options: ReadOptions | None = None,
        *,
        transform=None,
        views: int = 1,
        num_processes: int | None = None,
        state: ReadState | None = None,
        **overrides,
    ):
        options = merge(options, overrides)
        if transform is not None and not callable(transform):
            raise TypeError(
                f"transform must be a function fn(example, rng) -> dict, got {transform!r}"
            )
        if not isinstance(views, int) or isinstance(views, bool) or views < 1:
            raise ValueError(f"views must be a whole number >= 1, got {views!r}")
        if not isinstance(batch_size, int) or batch_size % views:
            raise ValueError(
                f"batch_size {batch_size!r} must be a multiple of views={views}: the views "
                "of an image go in one batch"
            )
        if num_processes is None:
            num_processes = default_processes()
        if not isinstance(num_processes, int) or num_processes < 0:
            raise ValueError(f"num_processes must be a whole number >= 0, got {num_processes}")
        if num_processes:
            check_transform(transform)  # refused now, not in a process later
        self.transform, self.views, self.num_processes = transform, views, num_processes
        if state is None:  # the read as a state from its start: state_dict() says where
            state, options = start_state(options, split, batch_size // views)
        self._args = (data_dir, split, batch_size // views, options)
        self.options = options
        self.decoded = 0  # images decoded by the last iteration (once each, any views)
        self.load_state_dict({"read_state": state.to_json()})

    def state_dict(self) -> dict:
        """Where this reader stands: ``{"read_state": ReadState JSON}``, advanced by the
        batches this iteration yielded."""
        return {"read_state": self._state.advance(self._consumed).to_json()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continues the read ``state_dict`` saved (any worker count)."""
        saved = ReadState.from_json(state_dict["read_state"])
        self._source = RecordSource(*self._args, saved)
        self._state, self._consumed = self._source.read.state, 0

    def __len__(self) -> int:
        return len(self._source)

    def __iter__(self):
        options = self.options
        preprocess = Preprocess(
            self.transform,
            self.num_processes,
            options.channels,
            options.image_size,
            self._state.seed,
            self.views,
            options.augment(),
        )
        self._consumed = 0
        for batch in preprocess.map(iter(self._source)):
            self._consumed += 1
            self.decoded = preprocess.decoded
            yield batch
