"""A TFDS-prepared dataset as input (issue 42): its version folder (``NAME/VERSION``:
``dataset_info.json``, ``features.json``, the shards ``NAME-SPLIT.tfrecord-*``).

The shards are TFRecord files of tf.train.Example, read as ``--input_format=tfrecord``
reads them (``tfrecord_source``); what TFDS adds is read here, in the driver:
which splits there are and that they are TFRecord (``check``), the image and the
ClassLabel features (``features.json``: the defaults of ``--image_feature`` and
``--label_feature``), and the class names (``LABEL.labels.txt``: the labels, an
int label a position in them).
"""

from __future__ import annotations

import dataclasses
import json

from beam_jobs.tfrecord_source import FORMAT as TFRECORD
from convert_core import paths
from convert_core.options import RECORD_FORMATS, UserError
from schemas import storage
from schemas.errors import InvalidValueError

INFO, FEATURES = RECORD_FORMATS["tfds"].beside  # dataset_info.json, features.json


def _json(root: str, name: str, what: str) -> dict:
    try:
        with storage.open_text(f"{root}/{name}") as f:
            found = json.load(f)
        if not isinstance(found, dict):
            raise InvalidValueError("not an object")
        return found
    except (OSError, ValueError) as e:  # missing, or not JSON
        missing = isinstance(e, OSError)
        problem = "a JSON object" if str(e) == "not an object" else "JSON"
        raise UserError(
            f"--input: {'no ' + name if missing else f'{name} is not {problem}'} in "
            f"{root!r}; give a TFDS-prepared dataset's version folder (NAME/VERSION), {what}"
        ) from None


def check(root: str, split: str | None) -> tuple[str | None, str | None]:
    """The version folder ``root`` is a TFDS dataset in TFRecord files that has
    ``split`` (None: any); returns the features.json defaults of the image and the
    label feature (the only Image and ClassLabel features at its top, else None).

    Raises:
        UserError: no dataset_info.json, another file format, no such split.
    """
    info = _json(root, INFO, "which holds it")
    fmt = info.get("fileFormat", "tfrecord")
    if fmt != "tfrecord":
        raise UserError(
            f"--input: the TFDS dataset {root!r} is in {fmt} files; only tfrecord ones are "
            "read (prepare it with file_format='tfrecord')"
        )
    splits = sorted(s.get("name", "") for s in info.get("splits", []))
    if split is not None and split not in splits:
        raise UserError(
            f"--input_split: the TFDS dataset {root!r} has no split {split!r}; its splits: "
            f"{', '.join(splits) or 'none'}"
        )
    features = _json(root, FEATURES, "which holds it").get("featuresDict", {})
    found = features.get("features", {})
    images = [n for n, f in found.items() if "image" in f]
    labels = [n for n, f in found.items() if "classLabel" in f]
    return (
        images[0] if len(images) == 1 else None,
        labels[0] if len(labels) == 1 else None,
    )


def class_names(path: str, label: str) -> tuple[str, ...] | None:
    """The names TFDS wrote beside the shard ``path`` for ClassLabel ``label``."""
    try:
        with storage.open_text(f"{paths.posix_dirname(path)}/{label}.labels.txt") as f:
            names = tuple(line.strip() for line in f if line.strip())
    except OSError:  # no file: not a ClassLabel, or its names not written
        return None
    return names or None


FORMAT = dataclasses.replace(
    TFRECORD,
    name="tfds",
    what="TFDS",
    files="NAME-SPLIT.tfrecord-*",
    class_names=class_names,
    feature_defaults=check,
)
