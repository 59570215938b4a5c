"""A ``TorchReader``'s read with views together, on any backend: its one state
(``state_dict()``, ``load_state_dict()``; which state each pass reads:
``reader.routes.torch_passes``), its backend's pipeline (``reader.routes.torch_backend``),
and the batches of each ``DataLoader`` worker: ``w, w + W, ...``, tagged to be counted
where they arrive (``tally``: a ``reader.handover.Tally``). A read with views spread is
``reader.routes.torch_spread``'s.
"""

from __future__ import annotations

import torch

from reader.routes.torch_backend import Pipeline, default_backend
from reader.routes.torch_passes import Passes, worker_state
from reader.routes.torch_tensors import converter
from schemas.errors import InvalidTypeError


class TorchRead:
    """The read of ``TorchReader``'s arguments (``backend`` None: the faster for the
    machine; ``state`` None: from its start)."""

    # in a StatefulDataLoader's worker: the loader counts what it yielded (state_dict asked there)
    loader_counts = False

    def __init__(self, data_dir, split, batch_size, options, stage, backend, state, tally):
        # a batch of the read: batch_size images, or batch_size / views of the Python
        # route (its views together), as NumpyReader's state counts them
        unit = batch_size // stage.views if backend == "python" else batch_size
        self.passes = Passes(data_dir, split, unit, options, state)
        self.options, self.tally = self.passes.options, tally
        tally.load(_in_worker())
        sources = self.passes.sources
        self.backend = backend or default_backend([s.info for s in sources])
        args = (data_dir, split, batch_size, self.options)
        self.pipeline = Pipeline(self.backend, args, stage, sources)

    def state_dict(self) -> dict:
        """``TorchReader.state_dict()``: in a DataLoader worker, the batches it yielded
        and the next; else the batches that reached this process."""
        info, passes = torch.utils.data.get_worker_info(), self.passes
        if info is not None:  # a StatefulDataLoader's worker: batches go untagged
            self.loader_counts = True
            first = (passes.first_dealt(info.id) - passes.consumed) % info.num_workers
            return worker_state(passes.standing().to_json(), first)
        return {"read_state": passes.standing(self.tally.received()).to_json()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.passes.load(state_dict)
        self.pipeline.drop()
        self.tally.load(_in_worker())

    def __len__(self) -> int:
        if self.passes.len is None:
            raise InvalidTypeError("an endless read (epochs=None) has no length")
        return self.passes.len

    def batches(self, shaped):
        """A pass's batches as tensors, each through ``shaped``: from the state loaded for
        it, else from the read's beginning (chosen now, not in the generator: a
        StatefulDataLoader asks state_dict() before the first batch)."""
        self.passes.start()
        return self._batches(shaped)

    def _batches(self, shaped):
        info, passes = torch.utils.data.get_worker_info(), self.passes
        convert = converter(self.backend, passes.sources[0].info.record_kind)
        self.tally.start(in_worker=info is not None)
        # a DataLoader worker's batches: first, first + every, ...
        every, first = (1, 0) if info is None else (info.num_workers, passes.first_dealt(info.id))
        for j, batch in enumerate(self.pipeline.batches(passes.state, every, first)):
            passes.consumed = first + j * every + 1  # batches of the read up to this one
            out = shaped(convert(batch))
            if info is not None and not self.loader_counts:  # counted where it arrives
                out = self.tally.sent(out, passes.consumed, every)
            yield out


def _in_worker() -> bool:
    return torch.utils.data.get_worker_info() is not None
