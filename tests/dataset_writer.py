"""``write_dataset``: a dataset written as ``evenshard convert`` writes it, without
running Beam (how: ``tests/dataset_writing.py``).

Convert's core (``convert_core``: no Beam, 0.24 CPU-s of numpy and the format's
modules; Beam's convert was 4) loads at the first call, not with this module: a worker
process that unpickles a transform a test module defines imports that module, and with
it all it imports, once a process (several per test)."""

from __future__ import annotations


def write_dataset(input_path: str, output_dir: str, *flags: str) -> dict:
    """``dataset_writing.write_dataset``: the dataset ``convert --input=INPUT
    --output_dir=OUT FLAGS`` writes."""
    from dataset_writing import write_dataset as write

    return write(input_path, output_dir, *flags)
