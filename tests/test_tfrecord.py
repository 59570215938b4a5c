"""TFRecord framing (schemas.tfrecord), pinned against TensorFlow's own reader and writer."""

from __future__ import annotations

import gzip
import io

import pytest
import tensorflow as tf

from schemas import tfrecord

pytestmark = pytest.mark.fast  # the unit lane: make test-fast

RECORDS = [b"", b"a", bytes(range(256)) * 40]


def test_our_frames_are_what_tensorflow_writes(tmp_path):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in RECORDS:
            w.write(r)
    with open(path, "rb") as f:
        assert f.read() == b"".join(tfrecord.frame(r) for r in RECORDS)


def test_our_reader_reads_plain_and_gzip_streams(tmp_path):
    data = b"".join(tfrecord.frame(r) for r in RECORDS)
    plain, zipped = tmp_path / "x.tfrecord", tmp_path / "x.tfrecord.gz"
    plain.write_bytes(data)
    zipped.write_bytes(gzip.compress(data))
    assert list(tfrecord.iter_records(str(plain))) == RECORDS
    assert list(tfrecord.iter_records(str(zipped))) == RECORDS
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(zipped), "GZIP")] == RECORDS


@pytest.mark.parametrize(
    "damage,problem",
    [
        (lambda d: d[:-3], "file ends inside a record"),
        (lambda d: d[:5], "file ends inside a record header"),
        (lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "data checksum mismatch"),
        (lambda d: d[:2] + bytes([d[2] ^ 1]) + d[3:], "length checksum mismatch"),
    ],
)
def test_damage_is_named_by_record_and_offset(damage, problem):
    data = damage(b"".join(tfrecord.frame(r) for r in [b"x" * 10, b"y" * 10]))
    with pytest.raises(tfrecord.CorruptRecord, match=problem) as e:
        list(tfrecord.iter_records("shard.tfrecord", raw=io.BytesIO(data)))
    assert e.value.path == "shard.tfrecord"


def test_hashing_reader_counts_and_hashes_what_it_reads():
    import hashlib

    data = b"".join(tfrecord.frame(r) for r in RECORDS)
    hashed = tfrecord.HashingReader(io.BytesIO(data))
    assert list(tfrecord.iter_records("x", raw=hashed)) == RECORDS
    hashed.drain()
    assert hashed.num_bytes == len(data)
    assert hashed.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
