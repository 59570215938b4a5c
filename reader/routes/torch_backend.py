"""TorchReader's defaults from the machine (its ranks, the faster backend), and its
backend's pipeline: built in the process that iterates, kept across forks (DALI's)."""

from __future__ import annotations

import dataclasses
import gc
import os
import weakref

import torch

from schemas.images import DALI_FORMATS

# pipelines a forked process inherited: kept, never destroyed (Pipeline.drop)
INHERITED: list = []
# DALI readers built in this process (see _collect_before_fork)
BUILT: weakref.WeakSet = weakref.WeakSet()
_TF_BUILT: set[int] = set()  # processes that built a tf pipeline (started TensorFlow)


def _collect_before_fork() -> None:
    """A DALI pipeline is in a reference cycle (its external source is a method of its
    reader), so one let go waits for the garbage collector; collected in a forked
    DataLoader worker, whose fork did not copy the pipeline's threads, its ``__del__``
    waits for them forever. While this process holds DALI readers it built, garbage is
    collected before each fork, here, where the threads are."""
    if len(BUILT):
        gc.collect()


os.register_at_fork(before=_collect_before_fork)


def distributed_workers() -> tuple[int, int] | None:
    """(world size, rank) of torch.distributed, else of RANK/WORLD_SIZE, else None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    return None


def with_ranks(o):
    """Options ``o`` reading this process's rank's share, where they name no workers."""
    if o.input_context is None and o.num_workers is None:
        ranks = distributed_workers()
        if ranks:
            return dataclasses.replace(o, num_workers=ranks[0], worker_index=ranks[1])
    return o


def default_backend(infos: list, gpu: bool | None = None) -> str:
    """The faster backend for this machine and these datasets: "dali" where a CUDA GPU
    is visible (``gpu``), DALI is installed and decodes every dataset (its formats,
    uncompressed shards), else "python", the read engine (less CPU an image than the
    tf.data graph: 1,006 against 1,134 us on photos at 224 px, 270 against 283 on
    small PNGs, every process counted; and no TensorFlow in the process: the first
    batch in 3 s rather than 9). "tf" where it is asked for.

    ``gpu`` None asks ``torch.cuda.device_count()``: it counts through NVML (where
    NVML answers) without starting CUDA, so forked DataLoader workers can still use the GPU
    (``torch.cuda.is_available()`` starts it unless PYTORCH_NVML_BASED_CUDA_CHECK=1),
    and a CPU build of torch, which cannot take DALI's CUDA images, counts none.
    """
    if any(info.record_kind == "example" for info in infos):
        return "python"  # records that are not images: DALI decodes images
    if gpu is None:
        gpu = torch.cuda.device_count() > 0
    if not gpu:
        return "python"
    from reader.routes.dali_decode import installed

    if not installed():
        return "python"
    fits = all(
        set(info.formats) <= set(DALI_FORMATS) and info.compression == "none" for info in infos
    )
    return "dali" if fits else "python"


class Pipeline:
    """A backend's pipeline over ``args`` (data_dir, split, batch_size, options), built in
    the process that iterates, on first use, for one state (tf: and one deal); a
    DataLoader worker's Python route starts no processes (the worker is the process)."""

    def __init__(self, backend: str, args: tuple, stage, sources: list):
        """``sources``: the read's (``reader.front.read.Source``); DALI's checked now."""
        if backend == "dali":
            from reader.routes.dali_decode import check_formats, check_options

            for source in sources:
                check_formats(source.data_dir, source.info)
            check_options(args[3])
        self.backend, self.args, self.stage = backend, args, stage
        self.reader = self.built_by = self.state = self.dealt = None
        self.left_early = False

    def __getstate__(self) -> dict:
        # a DataLoader with the "spawn" context pickles the reader: without its pipeline
        return {**self.__dict__, "reader": None, "built_by": None}

    def drop(self) -> None:
        """Lets the pipeline go; the parent's, copied by a fork, is kept: its threads are
        not here, and destroying it (DALI's __del__ shuts it down) would wait for them
        forever."""
        if self.reader is not None and self.built_by != os.getpid():
            INHERITED.append(self.reader)
        self.reader, self.built_by, self.left_early = None, None, False

    def batches(self, state, every: int, first: int):
        """The backend's batches ``first, first + every, ...`` of the read from ``state``
        (DALI and the Python route read only theirs; tf deals before decoding)."""
        if self.left_early and self.backend == "dali":
            # a DALI pipeline left mid-pass holds outputs it prefetched for that pass,
            # which its reset() keeps: the next pass gets a new one (under 0.5 s)
            self.drop()
        batches = self._built(state, (every, first))
        self.left_early = True
        if self.backend == "dali":
            batches.source.deal(every, first)  # before its records are read or decoded
        elif self.backend == "python":
            batches.deal(every, first)
        yield from batches
        self.left_early = False

    def _built(self, state, deal):
        if self.reader is not None and self.built_by != os.getpid():
            self.drop()  # the parent's pipeline, copied by the fork
        if self.reader is not None and self.state != state:
            self.drop()  # another pass's state: built anew
        if self.reader is not None and self.backend == "tf" and self.dealt != deal:
            self.drop()
        self.dealt = deal
        if self.reader is None:
            self.reader, self.built_by, self.state = self._build(state, deal), os.getpid(), state
        return self.reader

    def _build(self, state, deal):
        if self.backend == "dali":
            from reader.records.source import RecordSource
            from reader.routes.dali_decode import build

            reader = build(RecordSource(*self.args, state))
            BUILT.add(reader)
            return reader
        if self.backend == "python":
            from reader.routes.python_route import PythonRoute

            stage = self.stage
            if torch.utils.data.get_worker_info() is not None:
                # a DataLoader worker is the process: it may start none
                stage = dataclasses.replace(stage, num_processes=0)
            return PythonRoute(*self.args, stage=stage, state=state)
        from reader.front.read import check_sized, resolve
        from reader.routes import graph

        # a DataLoader worker, unless TensorFlow started here (a later pass)
        if torch.utils.data.get_worker_info() and os.getpid() not in _TF_BUILT:
            graph.check_not_forked()
        _TF_BUILT.add(os.getpid())
        data_dir, split, batch_size, options = self.args
        options = dataclasses.replace(options, prefetch_to_device=False)
        read = resolve(data_dir, split, batch_size, options, state)
        check_sized(options, batch_size, read)
        return graph.dataset(read, resumed=True, deal=deal)
