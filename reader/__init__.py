"""tf.data input pipelines over evenshard datasets.

import reader
info = reader.load_info(data_dir)
ds = reader.make_dataset(data_dir, split="train", batch_size=256, image_size=(224, 224))
"""

from reader.info import DatasetError, load_info
from reader.pipeline import make_dataset

__all__ = ["DatasetError", "load_info", "make_dataset"]
