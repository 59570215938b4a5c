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


def _huge_length(frame: bytes, fix_crc: bool) -> bytes:
    """``frame`` with its length field made huge, its CRC left or made to hold."""
    import struct

    length = struct.pack("<Q", 1 << 38)
    crc = struct.pack("<I", tfrecord.masked_crc(length)) if fix_crc else frame[8:12]
    return length + crc + frame[12:]


@pytest.mark.parametrize("fix_crc", [False, True])
@pytest.mark.parametrize("gz", [False, True])
def test_reading_past_damage_finds_every_whole_record_after_it(fix_crc, gz):
    records = [bytes([i]) * (50 + 13 * i) for i in range(10)]
    frames = [tfrecord.frame(r) for r in records]
    frames[4] = _huge_length(frames[4], fix_crc)  # the 5th record's length
    frames[7] = frames[7][:30] + bytes([frames[7][30] ^ 1]) + frames[7][31:]  # its data
    data = b"".join(frames)
    name = "x.tfrecord.gz" if gz else "x.tfrecord"
    raw = io.BytesIO(gzip.compress(data) if gz else data)
    got = list(tfrecord.records_and_damage(name, raw))
    starts = [sum(map(len, frames[:i])) for i in range(11)]
    lost = [item for item in got if isinstance(item, tfrecord.LostStretch)]
    # the 5th record's header is damaged: how many records its stretch held cannot be
    # known, so no index after it is; the 8th's data alone: one record, as its length says
    assert [(x.index, x.start, x.end, x.one_record) for x in lost] == [
        (4, starts[4], starts[5], False),
        (None, starts[7], starts[8], True),
    ]
    assert lost[1].problem == "data checksum mismatch"
    assert f"bytes {starts[4]} to {starts[5] - 1}" in lost[0].describe()
    assert lost[1].describe().startswith(f"byte {starts[7]}: data checksum mismatch")
    kept = [item for item in got if not isinstance(item, tfrecord.LostStretch)]
    assert kept == [(starts[i], records[i]) for i in (0, 1, 2, 3, 5, 6, 8, 9)]
    with pytest.raises(tfrecord.CorruptRecord, match="record 4"):  # the strict reader
        list(tfrecord.records_at(name, io.BytesIO(raw.getvalue())))


def test_damage_with_no_whole_record_after_it_is_lost_to_the_end():
    frames = [tfrecord.frame(bytes([i]) * 40) for i in range(3)]
    data = b"".join(frames)[:-10]  # cut inside the last record
    got = list(tfrecord.records_and_damage("x.tfrecord", io.BytesIO(data)))
    assert got[-1] == tfrecord.LostStretch(2, 2 * len(frames[0]), None, "file ends inside a record")
    assert "no record follows" in got[-1].describe()
    assert len(got) == 3


def test_a_gzip_file_not_named_gz_is_not_scanned_for_records():
    data = gzip.compress(b"".join(tfrecord.frame(r) for r in RECORDS))
    with pytest.raises(tfrecord.NotRecords, match="gzip-compressed"):
        list(tfrecord.records_and_damage("x.tfrecord", io.BytesIO(data)))


def test_damage_to_a_records_data_alone_keeps_the_index_of_those_after_it():
    frames = [tfrecord.frame(bytes([i]) * 40) for i in range(4)]
    frames[1] = frames[1][:20] + bytes([frames[1][20] ^ 1]) + frames[1][21:]
    got = list(tfrecord.records_and_damage("x.tfrecord", io.BytesIO(b"".join(frames))))
    assert got[1] == tfrecord.LostStretch(1, 56, 112, "data checksum mismatch", True)
    assert [item[1] for item in got if isinstance(item, tuple)] == [
        bytes([i]) * 40 for i in (0, 2, 3)
    ]


def test_a_zeroed_stretch_after_a_large_damaged_record_holds_no_place_to_check():
    """A stretch of zeros (the commonest damage: a block never written) is read past
    without a CRC a byte: a header is never 12 zero bytes. Counted, not timed: the
    CRCs computed (one a byte was a second a MB)."""
    calls = []
    real = tfrecord.masked_crc

    def counted(data):
        calls.append(len(data))
        return real(data)

    big = tfrecord.frame(bytes(range(256)) * (8 << 12))
    big = big[:100] + bytes([big[100] ^ 1]) + big[101:]
    data = big + bytes(1 << 20) + tfrecord.frame(b"after")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tfrecord, "masked_crc", counted)
        got = list(tfrecord.records_and_damage("x.tfrecord", io.BytesIO(data)))
    assert got[-1] == (len(big) + (1 << 20), b"after")
    assert len(calls) < 1000  # a CRC a place would be millions
