"""Readers of evenshard datasets: tf.data input pipelines for training and exact evaluation.

import reader
info = reader.load_info(data_dir)
ds = reader.make_dataset(data_dir, split="train", batch_size=256, image_size=(224, 224))
# or: options = reader.ReadOptions(seed=0, image_size=(224, 224))
#     ds = reader.make_dataset(data_dir, "train", 256, options)

# resuming after preemption: save state.advance(steps).to_json() beside the checkpoint
state = reader.ReadState(seed=0, batch_size=256)    # or ReadState.from_json(saved)
ds, state = reader.resume(data_dir, "train", state, image_size=(224, 224))

# PyTorch, DALI and numpy batches (a Python transform in worker processes), the same
# order: reader.TorchReader, reader.make_dali_pipeline, reader.NumpyReader
# (TorchReader.state_dict / load_state_dict; any of them resumes with another worker count)

# several splits or datasets by weight, for any reader in place of data_dir
both = reader.mix([("web/", 0.8), (("curated/", "train"), 0.2)])
ds = reader.make_dataset(both, batch_size=256, seed=0, image_size=(224, 224), epochs=None)

# an error from inside tf.data (a bucket's shard gone, say) in one line
try:
    next(iter(ds))
except Exception as e:
    print(reader.one_line(e))

TensorFlow, torch and DALI are imported on first use of the entry point that
needs them, not by ``import reader``.
"""

from reader.values.mixture import Mixture, mix
from reader.values.one_line import one_line
from reader.values.read_options import ReadOptions
from reader.values.state import ReadState
from schemas.dataset_info import DatasetInfo
from schemas.dataset_info import load_dataset_info as load_info
from schemas.errors import Error
from schemas.info import DatasetError

__all__ = [
    "DatasetError",
    "DatasetInfo",
    "Error",
    "Mixture",
    "NumpyReader",
    "ReadOptions",
    "ReadState",
    "TorchReader",
    "load_info",
    "make_dali_pipeline",
    "make_dataset",
    "mix",
    "one_line",
    "resume",
]

# entry point -> the module that defines it, imported on first use
_LAZY = {
    "NumpyReader": "reader.arrays",
    "make_dataset": "reader.pipeline",
    "resume": "reader.pipeline",
    "make_dali_pipeline": "reader.dali",
    "TorchReader": "reader.torch",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reader' has no attribute {name!r}")
