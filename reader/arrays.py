"""Batches of numpy arrays, for JAX and plain Python: ``NumpyReader``, with a Python
transform run in worker processes: the face of the spine's Python route
(``reader.routes.python_route``).

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

from reader.routes.ahead import Ahead
from reader.routes.jax_device import JaxMove, check_rows, checked_device
from reader.routes.python_route import PythonRoute
from reader.values.option_groups import GROUPS


class NumpyReader(PythonRoute):
    """Batches of one split as dicts of numpy arrays; ``len()`` is the number of batches.

    The records are read in the reader's one order (the same as ``make_dataset`` and
    ``TorchReader`` for the same options), decoded once each (libjpeg-turbo or
    Pillow, ``reader/decode/pixels.py``) in worker processes, and given to ``transform``
    once a view.

    Args:
        data_dir, split, batch_size, options, overrides: as for ``reader.make_dataset``
            (``data_dir`` may be a ``reader.mix``); ``image_size``: each decoded image
            (its crop with ``random_crop``) is resized to it (bilinear) before
            ``transform`` sees it; needed without a transform, so that the batch stacks.
        transform: ``fn(example, rng) -> dict`` (None: decode only). ``example`` holds
            ``image`` (uint8 HWC), ``label``, ``key``, ``epoch`` and ``view``; ``rng`` is
            a ``numpy.random.Generator`` seeded by (seed, key, epoch, view), so the output
            is the same for any ``num_processes`` and after any resume. What it returns
            goes out as it is: values that are arrays of one shape (or numbers: 1 and
            0.5 at their common type) are stacked, others come as lists. Every example
            must return the same fields (None where one has no value): a field some
            lack stops the read, naming it.
        views: transformed views of each decoded image (each image decoded once).
        mirror_views: views in mirrored pairs (``views`` even): view 2k+1 is view 2k's
            crop (``random_crop``), flipped ("5 random crops and their mirrors":
            ``views=10``).
        view_spread: where the views go: ``"together"`` (default), consecutive in one
            batch (``batch_size`` a multiple of ``views``: SimCLR/DINO pairs); or a
            whole number D, each batch one view of ``batch_size`` images and the views
            of an image at least D batches apart (``reader/order/views.py``).
        num_processes: worker processes (default: the cores; 0: in this process).
        state: a :class:`reader.ReadState` to resume (any worker count).
        device: None (numpy arrays), or where JAX puts them (a ``jax.Device``, a
            ``Sharding``, or "gpu", "tpu", "cpu": its first device): each batch's arrays
            put there with ``jax.device_put`` two batches before the loop takes them
            (``reader.routes.jax_device``); ``key`` and other lists stay lists.
            ``state_dict()`` counts the batches taken.

    Raises:
        TypeError: a transform that cannot be sent to worker processes (a lambda).
        ValueError, DatasetError: as ``make_dataset``; an option of a group it does not
            take (``as_supervised``; tf.data's ``cache``, ``prefetch``,
            ``num_parallel_calls``; ``prefetch_to_device``).
    """

    takes = frozenset(GROUPS) - {"form", "tuning", "device"}
    face = "NumpyReader"
    instead = {
        "form": "its batches are dicts: take batch['image'], batch['label']",
        "tuning": "its worker processes are num_processes=; the in-memory cache, "
        "prefetch and parallel calls are tf.data's (reader.make_dataset)",
        "device": 'prefetch_to_device is tf.data\'s: give NumpyReader(device="gpu") for JAX',
    }
    _ahead = None  # batches put on a JAX device ahead of the loop (device=)

    def __init__(self, data_dir, split="train", batch_size=32, options=None, *, device=None, **kw):
        ahead = None if device is None else Ahead(JaxMove(checked_device(device)))
        super().__init__(data_dir, split, batch_size, options, **kw)
        if ahead is not None:
            check_rows(ahead.move.device, batch_size, self.options)
        self._ahead = ahead

    def state_dict(self) -> dict:
        if self._ahead is not None and self._ahead.state is not None:
            return self._ahead.state  # the batches the loop took, not those put ahead
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        if self._ahead is not None:
            self._ahead.state = None

    def __iter__(self):
        if self._ahead is None:
            return super().__iter__()
        return self._put_ahead()

    def _put_ahead(self):
        """The pass's batches on the device, the state the loop's from its first batch:
        the pass starts there, as without a device (until then ``state_dict()`` is the
        batches the last pass's loop took, not the read that went ahead of it)."""
        yield from self._ahead.batches(super().__iter__(), super().state_dict)
