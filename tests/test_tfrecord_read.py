"""How convert reads a TFRecord file (issue 42, item 4): a small file in one read, framed
in memory; a large one as a stream. Both give the same records and the same rejects."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from beam_jobs import paths
from evenshard import synthetic
from schemas import tfrecord
from schemas.example import serialize_example


def _records(n: int, side: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [
        serialize_example({"image_raw": synthetic.image_bytes("png", side, side, rng), "label": i})
        for i in range(n)
    ]


def _reader(root: str):
    from beam_jobs.inspect_images import InspectImages
    from beam_jobs.record_formats import record_format
    from beam_jobs.record_rules import RecordFeatures, RecordRules

    rules = RecordRules(RecordFeatures("image_raw", "label", "int64"), None, "--labels")
    inspect = InspectImages("full", 10**9, 100, root).arguments
    reader = record_format("tfrecord").reader(root, rules, inspect, None)
    reader.setup()
    return reader


def _read(root: str, path: str) -> list[tuple]:
    """(key, reason or "", record place) of each element the reader gives for ``path``."""
    return [
        (e.key, getattr(e, "reason", ""), getattr(e, "record", None))
        for e in _reader(root).process(path)
    ]


@pytest.mark.fast
@pytest.mark.parametrize("name", ["r.tfrecord", "r.tfrecord.gz"])
@pytest.mark.parametrize("side", [8, 96])  # a file under WHOLE_FILE bytes, one over it
def test_a_file_read_whole_or_streamed_gives_the_same_records_and_rejects(
    tmp_path, monkeypatch, name, side
):
    from beam_jobs import tfrecord_source

    records = _records(12, side)
    data = b"".join(tfrecord.frame(r) for r in records)
    small = len(data) <= tfrecord_source.WHOLE_FILE
    assert small == (side == 8)
    path = str(tmp_path / name)
    cut = data[: len(data) - len(tfrecord.frame(records[-1])) // 2]  # inside the last
    places, offset = [], 0
    for r in records:
        places.append((offset, len(r)))
        offset += len(tfrecord.frame(r))
    streamed = []
    monkeypatch.setattr(paths, "open_binary", lambda p: streamed.append(p) or open(p, "rb"))
    for body, want in (
        (data, [(f"{name}#{i}", "", place) for i, place in enumerate(places)]),
        (cut, [(f"{name}#{i}", "", place) for i, place in enumerate(places[:11])]),
    ):
        with open(path, "wb") as f:
            f.write(gzip.compress(body, mtime=0) if name.endswith(".gz") else body)
        if body is cut:
            want.append((f"{name}#11", "truncated", None))
        assert _read(str(tmp_path), path) == want
    # a small file in one read, never opened as a stream; a large one streamed
    assert streamed == ([] if small else [path, path])


@pytest.mark.fast
def test_a_file_that_cannot_be_read_is_one_reject(tmp_path):
    folder = tmp_path / "d.tfrecord"
    folder.mkdir()
    gone = str(tmp_path / "gone.tfrecord")
    assert [r for _, r, _ in _read(str(tmp_path), gone)] == ["missing"]
    assert [r for _, r, _ in _read(str(tmp_path), str(folder))] == ["unreadable"]
    assert not os.path.exists(gone)
