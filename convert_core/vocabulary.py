"""The vocabulary: the dataset's labels (ids = positions) and image formats."""

from __future__ import annotations


def vocabulary(
    labels: set[str], formats: set[str], fixed: list[str] | None = None, numbered: bool = False
) -> dict:
    """{"labels": [...], "formats": [...]} of the written images' labels and formats.

    Labels are the sorted distinct labels (as TFDS ImageFolder does), or exactly
    ``fixed`` (a ``--labels`` file) in its order; ``numbered`` (a record's int labels,
    as text): "0" to the largest, so each int is its own id. "": no label, no format
    (``--record_kind example`` without ``--label_feature``).
    """
    labels, formats = labels - {""}, formats - {""}
    if fixed:
        names = list(fixed)
    elif numbered and labels:
        names = [str(i) for i in range(max(map(int, labels)) + 1)]
    else:
        names = sorted(labels)
    return {"labels": names, "formats": sorted(formats)}
