"""The small dataset the trainer's controls are tested on (issue 45: explain, skip,
exclude), written once a test process, and every face's batches read as plain values.

``tests/test_explain.py``, ``test_skip.py`` and ``test_controls_faces.py`` read the
same 72 images (3 labels, PNG): train in 4 shards, so 3 workers read unequal counts,
and val.
"""

from __future__ import annotations

import numpy as np
from dataset_writer import write_dataset

import reader
from evenshard import synthetic

_WRITTEN: dict[str, str] = {}  # the test session's base folder -> the dataset


def controls_dataset(tmp_path_factory) -> str:
    """The dataset's folder, written on the first call of a test process."""
    base = str(tmp_path_factory.getbasetemp())
    if base not in _WRITTEN:
        root = tmp_path_factory.mktemp("controls") / "images"
        synthetic.make_image_folder(str(root), num_labels=3, per_label=24, formats=("png",))
        out = str(tmp_path_factory.mktemp("controls_out") / "ds")
        write_dataset(str(root), out, "--splits=train=0.75,val=0.25", "--num_shards=4")
        _WRITTEN[base] = out
    return _WRITTEN[base]


def same(example, rng):
    return example


def saved_after(r, batches: int) -> dict:
    """``r``'s ``state_dict()`` after ``batches`` of its batches, its iteration left."""
    it = iter(r)
    for _ in range(batches):
        next(it)
    it.close()
    return r.state_dict()


def keys(batches) -> list[list[str]]:
    return [[k.decode() if isinstance(k, bytes) else k for k in list(b["key"])] for b in batches]


def told(batches) -> list[list[str]]:
    return [b["key"] for b in batches]


# every face of the reader, as read_face names them
FACES = ("tf.data", "numpy", "torch-tf", "torch-python", "torch-dali", "dali")


def read_face(face: str, data, split, batch_size: int, state=None, **kw) -> list[dict]:
    """Every batch ``face`` yields, as dicts of numpy arrays (``key`` a list of str)."""
    if face == "tf.data":
        if state is None:
            batches = reader.make_dataset(data, split, batch_size, **kw)
        else:
            batches, _ = reader.resume(data, split, state, batch_size=batch_size, **kw)
    elif face == "numpy":
        batches = reader.NumpyReader(
            data, split, batch_size, state=state, transform=same, num_processes=0, **kw
        )
    elif face.startswith("torch-"):
        backend = face.split("-")[1]
        more = dict(num_processes=0) if backend == "python" else {}
        batches = reader.TorchReader(
            data, split, batch_size, backend=backend, state=state, **more, **kw
        )
    elif face == "dali":
        from reader.dali import make_dali_pipeline

        batches = make_dali_pipeline(data, split, batch_size, state=state, device="cpu", **kw)
    else:
        raise ValueError(f"no face {face!r}")
    return [plain(b) for b in batches]


def plain(batch: dict) -> dict:
    out = {
        name: value.numpy() if hasattr(value, "numpy") else value for name, value in batch.items()
    }
    out = {name: np.asarray(value) for name, value in out.items()}
    out["key"] = keys([out])[0]
    return out
