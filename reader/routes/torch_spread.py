"""``TorchReader``'s reads with views spread (``view_spread=D``): the Python route's own
state, which says how far into an image's views a read stands (``view_skip``: a
``ReadState`` cannot), read in the training process (a spread read is not dealt to
DataLoader workers: each image's views go out D batches apart, in one order).

A pass (``iter()``) reads from a state loaded for it (``load_state_dict``, ``state=``),
later passes from the read's beginning, as ``TorchReader``'s other reads do.
"""

from __future__ import annotations

import torch

from reader.routes.python_route import PythonRoute
from reader.routes.torch_tensors import from_numpy
from reader.values.state import ReadState
from schemas.errors import OperationError


def checked(data_dir, split: str, batch_size: int, options, stage, state):
    """The Python route's read checked now (the transform picklable, views and
    batch_size agree): its :class:`SpreadViews` where its views are spread, else None."""
    route = PythonRoute(data_dir, split, batch_size, options, stage=stage, state=state)
    return None if route.spread is None else SpreadViews(route, state)


class SpreadViews:
    """The Python route of a spread read, its beginning, and a state loaded for the
    next pass."""

    def __init__(self, route: PythonRoute, state):
        """``route``: the read, made with ``state`` (None: from its beginning)."""
        if state is not None:  # the beginning, with the state's seed; the state loaded
            data_dir, split, batch_size, options = route.args
            beginning = ReadState(state.seed, batch_size)
            stage = route.stage
            route = PythonRoute(data_dir, split, batch_size, options, stage=stage, state=beginning)
        self.route = route
        self.beginning = route.state_dict()
        self.pending = False  # a loaded state, not read yet
        if state is not None:
            self.load_state_dict({"read_state": state.to_json()})

    def state_dict(self) -> dict:
        _in_this_process("state_dict()")
        return self.route.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.route.load_state_dict(state_dict)
        self.pending = True

    def __len__(self) -> int:
        return len(self.route)

    def batches(self, shaped):
        """One pass's batches as tensors, each through ``shaped``: from a loaded state not
        read yet, else the beginning."""
        _in_this_process("iter()")
        if not self.pending:
            self.route.load_state_dict(self.beginning)
        self.pending = False
        return map(shaped, map(from_numpy, self.route))


def _in_this_process(what: str) -> None:
    if torch.utils.data.get_worker_info() is not None:
        raise OperationError(
            f"TorchReader(view_spread=...).{what} in a DataLoader worker: views spread "
            "are not dealt to workers (an image's views go out batches apart, in one "
            "order); iterate the reader itself or a DataLoader with num_workers=0, and "
            "let num_processes= decode and transform in parallel"
        )
