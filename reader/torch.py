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
import multiprocessing
import os
import secrets

import torch

from reader import handover
from reader.front.read import check_sized, check_state, merge, resolve, start_state
from reader.records.example_batches import holds_examples
from reader.routes.torch_backend import BUILT as _BUILT
from reader.routes.torch_backend import INHERITED as _INHERITED
from reader.routes.torch_backend import default_backend as _default_backend
from reader.routes.torch_backend import distributed_workers
from reader.routes.torch_passes import Passes
from reader.routes.torch_tensors import from_dali, from_examples, from_numpy, from_tf
from reader.values.mixture import Mixture
from reader.values.option_groups import GROUPS, PythonStage, refuse_untaken
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas.errors import InvalidTypeError, InvalidValueError, OperationError

# the groups of options TorchReader takes (reader/values/option_groups.py): all but the device
TAKES = frozenset(GROUPS) - {"device"}
INSTEAD = {
    "device": "its batches are CPU tensors (or CUDA ones from DALI on a GPU): move them "
    "with .to(device)"
}
_TF_BUILT: set[int] = set()  # processes that built a tf pipeline (started TensorFlow)


class TorchReader(torch.utils.data.IterableDataset):
    """Batches of one split as torch tensors; ``len()`` is the number of batches.

    Args:
        data_dir, split, batch_size, options, overrides: as for
            ``reader.make_dataset`` (``image_size`` required without a transform;
            ``data_dir`` may be a ``reader.mix``).
        state: a :class:`reader.ReadState` to resume (or ``load_state_dict``).
        backend: "dali", "tf", or None: DALI where a CUDA GPU is visible, DALI is
            installed and the dataset fits it (formats, uncompressed shards), else
            tf.data, the faster on the CPU (measured: DALI on the CPU read 600 img/s
            against the tf backend's 1,309; 20,000 real-photo JPEGs, 2 cores, 224x224,
            batches of 128). "dali" may still be asked for on the CPU. "python" with
            ``transform``, and by default with ``on_error="skip"``.
        layout: "NHWC" or "NCHW" for ``image``.
        transform, views, view_spread, mirror_views, num_processes: as for
            :class:`reader.NumpyReader`, whose batches these are as tensors (arrays
            become tensors, other values stay lists). In a ``DataLoader`` worker the
            worker runs the transform (it cannot start processes): ``num_workers=W``
            is then the parallelism; views spread are read in this process only, and
            saved and resumed with their own state (``reader.routes.torch_spread``).

    Each batch: ``image`` uint8 [N, H, W, C] (or [N, C, H, W]), ``label``
    int64 [N], ``key`` list of N str, ``mask`` bool [N] (False on the
    padding of ``pad_final_batch``); with ``as_supervised``, the tuple
    (image, label), or (image, label, mask) with ``pad_final_batch``. Use it directly, or in a
    ``DataLoader(reader, batch_size=None, num_workers=W)``, any W: it batches,
    shuffles and splits work across ranks itself, and worker ``w`` of W yields this
    reader's batches ``w, w + W, ...``, so the DataLoader's round robin gives the
    batches in the one order (DALI skips the others' records before decoding; the tf
    backend shards the batches before decoding too). ``state_dict()``
    counts the batches that reached the training process. In torchdata's
    ``StatefulDataLoader`` (any ``num_workers``), the loader's own ``state_dict()``
    resumes it exactly: each worker's reader says where it stands. A pass (``iter()``)
    in the process that loaded a state reads from it, later ones from the beginning
    (0 workers, StatefulDataLoader workers: a resumed run's later passes are the
    uninterrupted run's; a state saved after a pass ended resumes a whole pass); plain
    DataLoader workers that copied a reader given a state read from it each pass
    (``reader.routes.torch_passes``).

    Building checks the options and the split's files, and nothing more: the process
    that iterates builds the pipeline, on its first ``iter()`` (a pipeline made
    before a fork hangs in the forked DataLoader worker).
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
        if o.input_context is None and o.num_workers is None:
            ranks = distributed_workers()
            if ranks:
                o = dataclasses.replace(o, num_workers=ranks[0], worker_index=ranks[1])
        if layout not in ("NHWC", "NCHW"):
            raise InvalidValueError(f'layout must be "NHWC" or "NCHW", got {layout!r}')
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
            from reader.routes.python_route import PythonRoute

            # checked now: the transform picklable, views and batch_size agree
            route = PythonRoute(data_dir, split, batch_size, o, stage=stage, state=state)
            backend = "python"
            if route.spread is not None:  # the route's own state (reader.routes.torch_spread)
                from reader.routes.torch_spread import SpreadViews

                self._spread = SpreadViews(route, state)
        self._python = stage
        refuse_untaken(o, TAKES, "TorchReader", INSTEAD)
        # (image, label) tuples are made here, from the backends' dicts
        self.as_supervised = o.as_supervised
        o = dataclasses.replace(o, as_supervised=False)
        if self._spread is not None:
            self.layout, self.options, self.backend = layout, o, "python"
            return
        # a batch of the read: batch_size images, or batch_size / views of the Python
        # route (its views together), as NumpyReader's state counts them
        self._unit = batch_size // views if backend == "python" else batch_size
        if state is None:  # the read as a state from its start: state_dict() says where
            state, o = start_state(o, split, self._unit)
            beginning = state
        else:
            beginning = ReadState(state.seed, self._unit)
        self._passes, self._beginning = Passes(beginning), None
        self.layout, self.options = layout, o
        self._args = (data_dir, split, batch_size, o)
        self._reader, self._built_by, self._token = None, None, None
        self._in_worker = multiprocessing.RawValue("b", 0)  # a DataLoader worker iterated
        # load_state_dict() calls, shared with the DataLoader workers: a persistent worker
        # that still holds an older state refuses to read it (see __iter__)
        self._loads, self._loaded = multiprocessing.RawValue("l", 0), 0
        self.load_state_dict({"read_state": state.to_json()})  # the options and files checked
        self.backend = backend or _default_backend([s.info for s in self._sources])
        if self.backend == "dali":
            from reader.routes.dali_decode import check_formats, check_options

            for source in self._sources:
                check_formats(source.data_dir, source.info)
            check_options(o)

    # in a StatefulDataLoader's worker: the loader counts what it yielded (state_dict
    # asked there), and the worker's first batch from its state, when it resumed
    _loader_counts, _worker_first = False, None
    _spread = None  # views spread: their read and its state (reader.routes.torch_spread)

    def state_dict(self) -> dict:
        """Where this reader stands: ``{"read_state": ReadState JSON}``, advanced by the
        batches this process received from this iteration (save it beside the model's
        state_dict). In a ``DataLoader(num_workers=W)``, the batches the workers sent
        that reached this process (in the read's order: the DataLoader hands them over
        in turn), not those they read ahead; a new DataLoader with any W resumes.
        Asked in a DataLoader worker (torchdata's ``StatefulDataLoader`` asks each), the
        batches this worker yielded, and which it yields next.

        Raises:
            RuntimeError: where it cannot know: the DataLoader's ``pin_memory=True``
                thread takes batches ahead of the training loop, or the batches reached
                this process without their count (a ``collate_fn`` that rebuilds them),
                or several workers' batches reached it outside a DataLoader iterator.
        """
        if self._spread is not None:
            return self._spread.state_dict()
        info = torch.utils.data.get_worker_info()
        if info is not None:  # a StatefulDataLoader's worker: batches go untagged
            self._loader_counts = True
            first = (self._first_dealt(info) - self._consumed) % info.num_workers
            return handover.worker_state(self._state.advance(self._consumed).to_json(), first)
        consumed, state = self._consumed, self._state
        if handover.seen(self._token):
            consumed = handover.received(self._token)
            # the workers' passes read from the state they copied, else from the start
            state = self._passes.workers_read() or self._beginning_read().state
            if consumed == handover.PINNED:
                raise OperationError(
                    "TorchReader.state_dict() under DataLoader(pin_memory=True): the pin "
                    "thread takes batches ahead of the training loop, so which were trained "
                    "on is unknown; use pin_memory=False and move batches with "
                    ".to(device, non_blocking=True) in the loop"
                )
            if consumed == handover.UNORDERED:
                raise OperationError(
                    "TorchReader.state_dict(): batches of several DataLoader workers "
                    "reached this process outside a DataLoader iterator, so which were "
                    "trained on is unknown; iterate the DataLoader itself"
                )
        elif self._in_worker.value:
            raise OperationError(
                "TorchReader.state_dict(): a DataLoader worker reads this reader but none of "
                "its batches reached this process counted (a collate_fn that rebuilds them?); "
                "use DataLoader(reader, batch_size=None) without a collate_fn, or num_workers=0"
                " (a StatefulDataLoader's state is its own state_dict())"
            )
        return {"read_state": state.advance(consumed).to_json()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continues the read ``state_dict`` saved (any worker count: the ranks of this
        run read what the saved ones left, each record once; docs/design.md): this
        process's next pass, later ones from the beginning (``reader.routes.torch_passes``)."""
        if self._spread is not None:
            return self._spread.load_state_dict(state_dict)
        saved = ReadState.from_json(state_dict["read_state"])
        # the options and files checked, and the batch count, as the pipeline will
        data_dir, split, _, o = self._args
        read = resolve(data_dir, split, self._unit, o, saved)
        self._passes.load(read, handover.worker_first(state_dict))
        self._drop_pipeline()
        self._pass(read, handover.worker_first(state_dict))
        if torch.utils.data.get_worker_info() is not None:
            return  # a StatefulDataLoader's worker resumes: the flags shared stay
        if self._token is not None:
            handover.forget(self._token)
        # names the batches DataLoader workers send from this state (a new one for each:
        # batches of an older state still on their way are not counted for this one)
        self._token = secrets.token_hex(8)
        self._in_worker.value = 0
        self._loads.value += 1
        self._loaded = self._loads.value

    def _pass(self, read, worker_first: int | None) -> None:
        """The next pass reads ``read``: its pipeline is built anew where it was another's."""
        if self._reader is not None and self._state != read.state:
            self._drop_pipeline()
        self._sources, self._len = read.sources, read.yields
        self._state, self._consumed, self._worker_first = read.state, 0, worker_first

    def _beginning_read(self):
        """The read from its beginning (resolved once for each beginning)."""
        state = self._passes.beginning
        if self._beginning is None or self._beginning[0] != state:
            data_dir, split, _, o = self._args
            self._beginning = (state, resolve(data_dir, split, self._unit, o, state))
        return self._beginning[1]

    def __len__(self) -> int:
        if self._spread is not None:
            return len(self._spread.route)
        if self._len is None:
            raise InvalidTypeError("an endless read (epochs=None) has no length")
        return self._len

    def _drop_pipeline(self) -> None:
        """Lets the pipeline go; the parent's, copied by a fork, is kept: its threads are
        not here, and destroying it (DALI's __del__ shuts it down) would wait for them
        forever."""
        if self._reader is not None and self._built_by != os.getpid():
            _INHERITED.append(self._reader)
        self._reader, self._built_by, self._left_early = None, None, False

    def _pipeline(self, deal=(1, 0)):
        """The backend's pipeline, built in this process on first use (tf: for the
        batches ``deal`` gives this process)."""
        if self._reader is not None and self._built_by != os.getpid():
            self._drop_pipeline()  # the parent's pipeline, copied by the fork
        if self._reader is not None and self.backend == "tf" and self._dealt != deal:
            self._drop_pipeline()
        self._dealt = deal
        if self._reader is None:
            if self.backend == "dali":
                from reader.records.source import RecordSource
                from reader.routes.dali_decode import build

                self._reader = build(RecordSource(*self._args, self._state))
                _BUILT.add(self._reader)
            elif self.backend == "python":
                from reader.routes.python_route import PythonRoute

                stage = self._python
                if torch.utils.data.get_worker_info() is not None:
                    # a DataLoader worker is the process: it may start none
                    stage = dataclasses.replace(stage, num_processes=0)
                self._reader = PythonRoute(*self._args, stage=stage, state=self._state)
            else:
                from reader.routes import graph

                # a DataLoader worker, unless TensorFlow started here (a later pass)
                if torch.utils.data.get_worker_info() and os.getpid() not in _TF_BUILT:
                    graph.check_not_forked()
                _TF_BUILT.add(os.getpid())
                data_dir, split, batch_size, options = self._args
                options = dataclasses.replace(options, prefetch_to_device=False)
                read = resolve(data_dir, split, batch_size, options, self._state)
                check_sized(options, batch_size, read)
                self._reader = graph.dataset(read, resumed=True, deal=deal)
            self._built_by = os.getpid()
        return self._reader

    def __getstate__(self) -> dict:
        # a DataLoader with the "spawn" context pickles the reader: without its pipeline;
        # the shared flag goes to the processes it starts, not into other pickles
        spawning = multiprocessing.context.get_spawning_popen() is not None
        flag = self._in_worker if spawning else multiprocessing.RawValue("b", 0)
        loads = self._loads if spawning else multiprocessing.RawValue("l", self._loaded)
        return {
            **self.__dict__,
            "_reader": None,
            "_built_by": None,
            "_in_worker": flag,
            "_loads": loads,
        }

    def _first_dealt(self, info) -> int:
        """This DataLoader worker's first batch of the read from ``self._state``."""
        return info.id if self._worker_first is None else self._worker_first

    def __iter__(self):
        # a pass: from the state loaded for it, else from the read's beginning (here, not
        # in the generator: a StatefulDataLoader asks state_dict() before the first batch)
        if self._spread is not None:
            return map(self._shaped, map(from_numpy, self._spread.batches()))
        loaded = self._passes.start()
        if loaded is None:
            self._pass(self._beginning_read(), None)
        else:
            self._pass(loaded.read, loaded.worker_first)
        return self._batches()

    def _shaped(self, out: dict):
        """A batch of tensors in the layout asked, as a tuple with ``as_supervised``."""
        if self.layout == "NCHW" and "image" in out:
            out["image"] = out["image"].permute(0, 3, 1, 2)
        if self.as_supervised:
            out = out["image"], out["label"], out["mask"]
            out = out if self.options.pad_final_batch else out[:2]
        return out

    def _batches(self):
        info = torch.utils.data.get_worker_info()
        convert = {"dali": from_dali, "tf": from_tf, "python": from_numpy}[self.backend]
        if self._sources[0].info.record_kind == "example":
            convert = from_examples  # records that are not images: features, no image
        every, first = 1, 0  # a DataLoader worker's batches: first, first + every, ...
        if info is None:
            handover.forget(self._token)  # counted here, not by a DataLoader's worker
        else:
            if self._loads.value != self._loaded:
                raise OperationError(
                    "TorchReader.load_state_dict() after a DataLoader(persistent_workers="
                    "True) started its workers, which still hold the state they started "
                    "with: make the DataLoader after load_state_dict(), or use "
                    "persistent_workers=False"
                )
            self._in_worker.value = 1
            every, first = info.num_workers, self._first_dealt(info)
        if self._left_early and self.backend == "dali":
            # a DALI pipeline left mid-pass holds outputs it prefetched for that pass,
            # which its reset() keeps: the next pass gets a new one (under 0.5 s)
            self._drop_pipeline()
        batches = self._pipeline((every, first))
        self._left_early = True
        if self.backend == "dali":
            batches.source.deal(every, first)  # before its records are read or decoded
        elif self.backend == "python":
            batches.deal(every, first)
        for j, batch in enumerate(batches):
            self._consumed = first + j * every + 1  # batches of the read up to this one
            out = self._shaped(convert(batch))
            if info is not None and not self._loader_counts:  # counted where it arrives
                out = handover.sent(out, self._token, self._consumed, every)
            yield out
        self._left_early = False
