"""The spine's batches as torch tensors: from the tf graph stream, DALI and the Python
route (``TorchReader``'s backends), in the layout and form asked."""

from __future__ import annotations

import numpy as np
import torch


def from_tf(batch) -> dict:
    """A tf.data batch (``reader.routes.graph``) as tensors; ``mask`` all True when absent."""
    n = int(batch["label"].shape[0])
    mask = batch["mask"].numpy() if "mask" in batch else np.ones(n, bool)
    return {
        "image": torch.from_numpy(batch["image"].numpy()),
        "label": torch.from_numpy(batch["label"].numpy()),
        "key": [k.decode() for k in batch["key"].numpy()],
        "mask": torch.from_numpy(mask),
    }


def from_dali(batch) -> dict:
    """A DALI batch (``reader.routes.dali_decode``) as tensors: a GPU image copied into a CUDA
    tensor on DALI's stream, its padding rows zeros."""
    image = batch["image"]
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image)
    else:  # a DALI TensorListGPU: copy into a CUDA tensor on DALI's stream
        from reader.routes.dali_decode import feed_ndarray

        tensor = image.as_tensor()
        out = torch.empty(tensor.shape(), dtype=torch.uint8, device="cuda")
        feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream())
        mask = torch.from_numpy(batch["mask"]).to("cuda")
        image = out * mask[:, None, None, None].to(torch.uint8)  # padding is zeros
    return {
        "image": image,
        "label": torch.from_numpy(batch["label"]),
        "key": batch["key"],
        "mask": torch.from_numpy(batch["mask"]),
    }


def from_numpy(batch: dict) -> dict:
    """NumpyReader's batch as tensors: arrays become tensors, lists stay lists."""
    out = {}
    for name, value in batch.items():
        out[name] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return out


def from_examples(batch) -> dict:
    """A batch of records that are not images (tf.data's or the Python route's) as
    tensors: numbers as tensors, a ``Padded`` as a ``Padded`` of two tensors (values,
    lengths), bytes as numpy object arrays (torch has no string tensor), ``key`` a
    list of str, ``mask`` all True when absent."""
    from reader.examples import Padded

    def tensor(value):
        if isinstance(value, Padded):
            return Padded(tensor(value.values), tensor(value.lengths))
        value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        return value if value.dtype == object else torch.from_numpy(value)

    out = {}
    for name, value in batch.items():
        if name == "key":
            keys = value.numpy() if hasattr(value, "numpy") else value
            out[name] = [k.decode() if isinstance(k, bytes) else k for k in keys]
        else:
            out[name] = tensor(value)
    if "mask" not in out:
        first = next(iter(out.values()))
        n = len(first.lengths if isinstance(first, Padded) else first)
        out["mask"] = torch.ones(n, dtype=torch.bool)
    return out


def converter(backend: str, record_kind: str):
    """The function that turns a ``backend``'s batch into tensors."""
    if record_kind == "example":
        return from_examples  # records that are not images: features, no image
    return {"dali": from_dali, "tf": from_tf, "python": from_numpy}[backend]


def shaped(out: dict, layout: str, supervised: bool, padded: bool):
    """A batch of tensors in ``layout``; with ``supervised``, the tuple (image, label),
    or (image, label, mask) where ``padded`` (``pad_final_batch``)."""
    if layout == "NCHW" and "image" in out:
        out["image"] = out["image"].permute(0, 3, 1, 2)
    if supervised:
        out = out["image"], out["label"], out["mask"]
        out = out if padded else out[:2]
    return out
