"""TorchReader's defaults from the machine (its ranks, the faster backend), and its DALI
pipelines across forks."""

from __future__ import annotations

import gc
import os
import weakref

import torch

from schemas.images import DALI_FORMATS

# pipelines a forked process inherited: kept, never destroyed (TorchReader._pipeline)
INHERITED: list = []
# DALI readers built in this process (see _collect_before_fork)
BUILT: weakref.WeakSet = weakref.WeakSet()


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


def default_backend(infos: list, gpu: bool | None = None) -> str:
    """The faster backend for this machine and these datasets: "dali" where a CUDA GPU
    is visible (``gpu``), DALI is installed and decodes every dataset (its formats,
    uncompressed shards), else "tf" (DALI on the CPU read 600 img/s against the tf
    backend's 1,309, issue 31).

    ``gpu`` None asks ``torch.cuda.device_count()``: it counts through NVML (where
    NVML answers) without starting CUDA, so forked DataLoader workers can still use the GPU
    (``torch.cuda.is_available()`` starts it unless PYTORCH_NVML_BASED_CUDA_CHECK=1),
    and a CPU build of torch, which cannot take DALI's CUDA images, counts none.
    """
    if any(info.record_kind == "example" for info in infos):
        return "tf"  # records that are not images: DALI decodes images
    if gpu is None:
        gpu = torch.cuda.device_count() > 0
    if not gpu:
        return "tf"
    from reader.routes.dali_decode import installed

    if not installed():
        return "tf"
    fits = all(
        set(info.formats) <= set(DALI_FORMATS) and info.compression == "none" for info in infos
    )
    return "dali" if fits else "tf"
