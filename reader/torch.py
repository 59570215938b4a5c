"""PyTorch: an evenshard split as batches of torch tensors, with the reader's guarantees.

    from reader.torch import TorchReader
    train = TorchReader("out/", "train", 256, image_size=(224, 224), seed=0, epochs=None)
    for batch in train:   # {"image": uint8 NHWC (or NCHW), "label", "key", "mask"}
        ...

The face over three routes, the same records in one order: ``"dali"`` (CUDA tensors
on a GPU), ``"tf"`` (``reader.routes.graph``) and ``"python"`` (``reader.routes.python_route``); by
default the faster for the machine. ``torch.distributed`` workers (or ``RANK``/
``WORLD_SIZE``) read disjoint files with equal step counts.
"""

from __future__ import annotations

import dataclasses

import torch

from reader import handover
from reader.front.read import check_state, merge
from reader.records.example_batches import holds_examples
from reader.routes.ahead import AheadRead
from reader.routes.torch_backend import with_ranks
from reader.routes.torch_device import TorchMove, checked_device
from reader.routes.torch_read import TorchRead
from reader.routes.torch_tensors import shaped
from reader.values.mixture import Mixture
from reader.values.option_groups import GROUPS, PythonStage, refuse_untaken
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas.errors import InvalidValueError

# the groups of options TorchReader takes (reader/values/option_groups.py): all but the device
TAKES = frozenset(GROUPS) - {"device"}
INSTEAD = {"device": 'prefetch_to_device is tf.data\'s: give TorchReader(device="cuda")'}


class TorchReader(torch.utils.data.IterableDataset):
    """Batches of one split as torch tensors; ``len()`` is the number of batches.

    Args:
        data_dir, split, batch_size, options, overrides: as for
            ``reader.make_dataset`` (``image_size`` required without a transform;
            ``data_dir`` may be a ``reader.mix``).
        state: a :class:`reader.ReadState` to resume (or ``load_state_dict``).
        backend: "dali", "python", "tf", or None: DALI where a CUDA GPU is visible,
            DALI is installed and the dataset fits it (formats, uncompressed shards),
            else "python", the read engine (worker processes decode; TensorFlow is not
            imported). "tf": tf.data's graph. "dali" may still be asked for on the CPU.
            "python" always with ``transform``, views, ``num_processes`` or
            ``on_error="skip"``.
        layout: "NHWC" or "NCHW" for ``image``.
        device: None (CPU tensors), or "cuda" (a ``torch.device``): each batch copied
            there on a side stream two batches before the loop takes it, the Python
            route's from its shared memory page-locked once (``reader.routes.torch_device``);
            in the process that iterates, not a DataLoader worker.
        transform, views, view_spread, mirror_views, num_processes: as for
            :class:`reader.NumpyReader`, whose batches these are as tensors (arrays
            become tensors, other values stay lists). In a ``DataLoader`` worker the
            worker runs the transform (it cannot start processes): ``num_workers=W``
            is then the parallelism; views spread are read in this process only, and
            saved and resumed with their own state (``reader.routes.torch_spread``).

    Each batch: ``image`` uint8 [N, H, W, C] (or [N, C, H, W]), ``label`` int64 [N],
    ``key`` list of N str, ``mask`` bool [N] (False on the padding of
    ``pad_final_batch``); with ``as_supervised``, (image, label), or (image, label,
    mask) with ``pad_final_batch``. Use it directly, or in a ``DataLoader(reader,
    batch_size=None, num_workers=W)``, any W: it batches, shuffles and splits work
    across ranks itself, and worker ``w`` of W yields batches ``w, w + W, ...``
    (decoding only those), so the loader's round robin gives the one order.
    ``state_dict()`` counts the batches that reached the training process; in
    torchdata's ``StatefulDataLoader`` (any ``num_workers``) the loader's own
    ``state_dict()`` resumes it exactly. A pass (``iter()``) in the process that
    loaded a state reads from it, later ones from the beginning; plain DataLoader
    workers that copied a reader given a state read from it each pass
    (``reader.routes.torch_passes``). Building checks the options and the split's
    files; the process that iterates builds the pipeline, on its first ``iter()`` (one
    made before a fork hangs in the forked DataLoader worker).
    """

    def __init__(
        self,
        data_dir: str | Mixture,
        split: str = "train",
        batch_size: int = 32,
        options: ReadOptions | None = None,
        *,
        backend: str | None = None,
        layout: str = "NHWC",
        device=None,
        state: ReadState | None = None,
        transform=None,
        views: int = 1,
        view_spread: int | str = "together",
        mirror_views: bool = False,
        num_processes: int | None = None,
        **overrides,
    ):
        super().__init__()
        o = merge(options, overrides)
        check_state(state)
        o = with_ranks(o)
        if layout not in ("NHWC", "NCHW"):
            raise InvalidValueError(f'layout must be "NHWC" or "NCHW", got {layout!r}')
        device = checked_device(device)
        if backend not in ("dali", "tf", "python", None):
            raise InvalidValueError(
                f'backend must be "dali", "tf", "python" or None, got {backend!r}'
            )
        stage = PythonStage(transform, views, view_spread, mirror_views, num_processes)
        # on_error="skip" by default on the Python route (with tf.data a record fails
        # inside TensorFlow); DALI where it is asked for
        if o.image_size is None and transform is None and not holds_examples(data_dir):
            raise InvalidValueError("TorchReader batches decoded images: give image_size")
        if stage.route(o.on_error, backend) == "python":
            from reader.routes.torch_spread import checked

            self._read, backend = checked(data_dir, split, batch_size, o, stage, state), "python"
        refuse_untaken(o, TAKES, "TorchReader", INSTEAD)
        # (image, label) tuples are made here, from the backends' dicts
        self.as_supervised, self.layout = o.as_supervised, layout
        o = dataclasses.replace(o, as_supervised=False)
        if self._read is None:  # views together: the options and files checked now
            tally = handover.Tally()  # the batches DataLoader workers send
            self._read = TorchRead(data_dir, split, batch_size, o, stage, backend, state, tally)
            o = self._read.options
        self.options, self.backend = o, backend or self._read.backend
        if device is not None:  # batches moved to the device ahead of the loop
            self._read = AheadRead(self._read, TorchMove(device))

    _read = None  # the engine: reader.routes.torch_read, torch_spread with views spread;
    # with a device, routes.ahead.AheadRead over it

    def state_dict(self) -> dict:
        """Where this reader stands: ``{"read_state": ReadState JSON}``, advanced by the
        batches this process received from this iteration (save it beside the model's
        state_dict): in a ``DataLoader(num_workers=W)``, those the workers sent that
        reached it (the DataLoader hands them over in the read's order), not those read
        ahead; a new DataLoader with any W resumes. Asked in a DataLoader worker
        (torchdata's ``StatefulDataLoader`` asks each): the batches it yielded, and
        which it yields next.

        Raises:
            RuntimeError: where it cannot know: the DataLoader's ``pin_memory=True``
                thread takes batches ahead of the training loop, or the batches reached
                this process without their count (a ``collate_fn`` that rebuilds them),
                or several workers' batches reached it outside a DataLoader iterator.
        """
        return self._read.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Continues the read ``state_dict`` saved (any worker count: the ranks of this
        run read what the saved ones left, each record once; docs/design.md): this
        process's next pass, later ones from the beginning (``reader.routes.torch_passes``)."""
        self._read.load_state_dict(state_dict)

    def __len__(self) -> int:
        return len(self._read)

    def __iter__(self):
        return self._read.batches(self._shaped)

    def _shaped(self, out: dict):
        """A batch of tensors in the layout asked, as a tuple with ``as_supervised``."""
        return shaped(out, self.layout, self.as_supervised, self.options.pad_final_batch)
