"""Readers of evenshard datasets: tf.data input pipelines for training and exact evaluation.

import reader
info = reader.load_info(data_dir)
ds = reader.make_dataset(data_dir, split="train", batch_size=256, image_size=(224, 224))
# or: options = reader.ReadOptions(seed=0, image_size=(224, 224))
#     ds = reader.make_dataset(data_dir, "train", 256, options)

# resuming after preemption: save state.advance(steps).to_json() beside the checkpoint
state = reader.ReadState(seed=0, batch_size=256)    # or ReadState.from_json(saved)
ds, state = reader.resume(data_dir, "train", state, image_size=(224, 224))

# PyTorch and DALI: reader.torch.TorchReader, reader.dali.make_dali_pipeline (same order)

TensorFlow is imported on first use of ``make_dataset``, not by ``import reader``.
"""

from reader.options import ReadOptions
from reader.state import ReadState, resume
from schemas.info import DatasetError, load_info

__all__ = ["DatasetError", "ReadOptions", "ReadState", "load_info", "make_dataset", "resume"]


def __getattr__(name: str):
    if name == "make_dataset":
        from reader.pipeline import make_dataset

        return make_dataset
    raise AttributeError(f"module 'reader' has no attribute {name!r}")
