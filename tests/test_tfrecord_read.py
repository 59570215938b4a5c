"""How convert reads a TFRecord file (issue 42, item 4): a small file in one read, framed
in memory; a large one as a stream. Both give the same records and the same rejects. A
damaged gzip file keeps the records that came out of it before the damage."""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib

import numpy as np
import pytest

from evenshard import synthetic
from schemas import storage, tfrecord
from schemas.example import serialize_example


def _records(n: int, side: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [
        serialize_example({"image_raw": synthetic.image_bytes("png", side, side, rng), "label": i})
        for i in range(n)
    ]


def _reader(root: str):
    from beam_jobs.record_formats import record_format
    from convert_core.inspection import Inspector
    from convert_core.record_rules import RecordFeatures, RecordRules

    rules = RecordRules(RecordFeatures("image_raw", "label", "int64"), None, "--labels")
    inspect = (Inspector("full", 10**9, root, 100 * 10**6), None)
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
@pytest.mark.parametrize("small", [True, False])  # under WHOLE_FILE bytes, or over it
def test_a_file_read_whole_or_streamed_gives_the_same_records_and_rejects(
    tmp_path, monkeypatch, name, small
):
    from beam_jobs import tfrecord_source

    records = _records(12, 8)
    data = b"".join(tfrecord.frame(r) for r in records)
    if not small:  # a file over the limit: the limit made small, not the file large
        monkeypatch.setattr(tfrecord_source, "WHOLE_FILE", 1024)
    assert (len(data) <= tfrecord_source.WHOLE_FILE) == small
    assert len(gzip.compress(data, mtime=0)) > 1024  # the gzip file is over it too
    path = str(tmp_path / name)
    cut = data[: len(data) - len(tfrecord.frame(records[-1])) // 2]  # inside the last
    places, offset = [], 0
    for r in records:
        places.append((offset, len(r)))
        offset += len(tfrecord.frame(r))
    streamed = []
    monkeypatch.setattr(storage, "open_binary", lambda p: streamed.append(p) or open(p, "rb"))
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


@pytest.mark.fast
def test_read_ahead_keeps_the_order_and_holds_at_most_its_reads_in_flight():
    import threading

    from beam_jobs.tfrecord_source import read_ahead

    in_flight, most, lock = [0], [0], threading.Lock()
    all_in = threading.Barrier(3)  # the first three reads are in flight together

    def read(i: int) -> int:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        if i < 3:
            all_in.wait(timeout=30)
        with lock:
            in_flight[0] -= 1
        if i == 7:
            raise FileNotFoundError(i)
        return i * i

    futures = list(read_ahead(read, range(20), in_flight=3))
    assert [f.exception() is None for f in futures] == [i != 7 for i in range(20)]
    assert [f.result() for f in futures if f.exception() is None] == [
        i * i for i in range(20) if i != 7
    ]
    assert most[0] == 3


def test_a_buckets_files_read_ahead_give_what_each_read_alone_gives(bucket, tmp_path):
    """A chunk of a bucket's files, read ahead (``read_files``): the records and rejects
    of each file read alone, in order: a missing object and a damaged file among them.
    The writer's reads ahead of a shard give its images in the shard's order."""
    import zlib

    from beam_jobs.tfrecord_source import images_again
    from convert_core.records import Image

    records = _records(6, 8)
    for i, r in enumerate(records):
        data = tfrecord.frame(r)
        bucket.put(f"in/{i}.tfrecord", data[:-3] if i == 4 else data)
    root = f"{bucket.url}/in"
    files = [f"{root}/{i}.tfrecord" for i in (0, 1, 9, 2, 3, 4, 5)]  # 9: none
    reader = _reader(root)
    alone = [e for f in files for e in reader.process(f)]
    ahead = list(reader.read_files(files))
    assert ahead == alone
    assert [getattr(e, "reason", "") for e in ahead] == ["", "", "missing", "", "", "truncated", ""]
    images = [e for e in ahead if isinstance(e, Image)]
    shard = [(f"{root}/{im.key.split('#')[0]}", im) for im in images[::-1]]
    sizes = [im.num_bytes for im in images[::-1]]
    got = list(images_again(shard, "image_raw"))
    assert [problem for _, problem in got] == [None] * 5
    assert [len(image) for image, _ in got] == sizes
    assert all(zlib.crc32(image) == im.crc32 for (image, _), (_, im) in zip(got, shard))


def _payloads(n: int, size: int) -> list[bytes]:
    """Examples of an image, a label and ``size`` random bytes (which deflate keeps as
    they are: stored blocks)."""
    rng = np.random.default_rng(1)
    return [
        serialize_example(
            {
                "image_raw": synthetic.image_bytes("png", 8, 8, rng),
                "label": i,
                "noise": rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
            }
        )
        for i in range(n)
    ]


def _gzip_a_block_a_record(records: list[bytes]) -> tuple[bytes, list[int]]:
    """One gzip stream, each record's frame deflated and flushed to a byte boundary, so
    record i's bytes are all out before compressed byte ``starts[i]``, where the deflate
    block that holds its frame begins."""
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out, starts = [], []
    for r in records:
        starts.append(sum(map(len, out)))
        out.append(z.compress(tfrecord.frame(r)) + z.flush(zlib.Z_FULL_FLUSH))
    out.append(z.flush())
    return b"".join(out), starts


def _kept_and_rejected(path: str, data: bytes) -> tuple[list[bytes], tfrecord.CorruptRecord]:
    kept = []
    with pytest.raises(tfrecord.CorruptRecord) as e:
        for record in tfrecord.iter_records(path, io.BytesIO(data)):
            kept.append(record)
    return kept, e.value


def _offsets(records: list[bytes]) -> list[int]:
    return [sum(len(r) + tfrecord.FRAME_OVERHEAD for r in records[:i]) for i in range(len(records))]


# (records, their size, the damaged one): 20 KB in all; 1.5 MB, damaged in its second MB
_SIZES = {"small": (10, 2000, 6), "large": (15, 100_000, 12)}


@pytest.mark.fast
@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("damage", ["block", "byte"])
def test_a_damaged_gzip_file_keeps_the_records_before_the_damage(
    tmp_path, monkeypatch, size, damage
):
    """A flipped byte in a .tfrecord.gz. ``block``: a deflate block made invalid, zlib
    fails there; the record it holds is rejected as a damaged gzip stream. ``byte``: a
    record's byte flipped in a stored block, zlib decodes on and fails only on the
    trailer's CRC; the record is rejected by its own CRC. Either way the records before
    it are kept (their bytes out of zlib before the damage), whatever the size of the
    pieces fed to zlib: one at once lost them (a 1 MB read: every record of the file)."""
    n, each, bad = _SIZES[size]
    records = _payloads(n, each)
    if damage == "block":
        data, starts = _gzip_a_block_a_record(records)
        cut = starts[bad]  # bits 1 and 2 (BTYPE) 11: no such block type
    else:
        stored = b"".join(tfrecord.frame(r) for r in records)
        data = gzip.compress(stored, compresslevel=0, mtime=0)
        middle = len(records[bad]) // 2  # in the noise
        cut = data.index(records[bad][middle : middle + 64])
    assert (cut > 1 << 20) == (size == "large")
    damaged = bytearray(data)
    damaged[cut] = 0xFF if damage == "block" else damaged[cut] ^ 0xFF
    problem = "gzip stream is damaged: " if damage == "block" else "data checksum mismatch"
    for piece in (1000, tfrecord._PIECE, 1 << 20):
        monkeypatch.setattr(tfrecord, "_PIECE", piece)
        kept, e = _kept_and_rejected("d.tfrecord.gz", bytes(damaged))
        assert kept == records[:bad]
        assert (e.index, e.offset) == (bad, _offsets(records)[bad])
        assert e.problem.startswith(problem), e.problem
    if damage == "block":
        assert "invalid block type" in e.problem
    # convert's reader, the file read whole or streamed: the records before, one reject
    path = str(tmp_path / "d.tfrecord.gz")
    with open(path, "wb") as f:
        f.write(damaged)
    places = list(zip(_offsets(records), map(len, records)))
    want = [(f"d.tfrecord.gz#{i}", "", place) for i, place in enumerate(places[:bad])]
    want.append((f"d.tfrecord.gz#{bad}", "corrupt", None))
    if damage == "byte":  # zlib decodes on: the records after the damaged one are read
        # past it, and the trailer's CRC, which fails, is one input more
        want += [(f"d.tfrecord.gz#{i}", "", places[i]) for i in range(bad + 1, n)]
        want.append((f"d.tfrecord.gz#{n}", "corrupt", None))
    from beam_jobs import tfrecord_source

    for whole in (True, False):
        monkeypatch.setattr(tfrecord_source, "WHOLE_FILE", 1 << 22 if whole else 1024)
        assert _read(str(tmp_path), path) == want
        rejects = [r for r in _reader(str(tmp_path)).process(path) if hasattr(r, "reason")]
        assert rejects[0].detail.startswith(f"record {bad} (byte {places[bad][0]}): {problem}")
        if damage == "byte":
            assert "incorrect data check" in rejects[1].detail


@pytest.mark.fast
def test_a_gzip_file_whose_trailer_alone_is_damaged_keeps_every_record(tmp_path):
    """Every record out and checked, the gzip trailer's CRC wrong: all kept, and the
    reject names the place after the last."""
    records = _payloads(4, 500)
    damaged = bytearray(gzip.compress(b"".join(tfrecord.frame(r) for r in records), mtime=0))
    damaged[-5] ^= 0xFF  # the CRC-32 of the uncompressed bytes
    kept, e = _kept_and_rejected("t.tfrecord.gz", bytes(damaged))
    assert kept == records
    end = _offsets(records + [b""])[-1]
    assert (e.index, e.offset) == (4, end) and "incorrect data check" in e.problem


@pytest.mark.slow
def test_a_converted_gzip_file_with_a_flipped_byte_keeps_the_records_before_it(tmp_path):
    """TensorFlow's GZIP writer, one byte flipped mid-file: convert keeps the records
    before the damage (each byte for byte, as ``--record_kind example`` writes them) and
    rejects the one at it, named by index and byte; where zlib decodes on past the flip
    (the records' bytes vary between runs, and so where the flip lands), it reads past it
    the records after it, and rejects the gzip trailer whose CRC the flip broke; one
    worker and two processes alike."""
    from conftest import read_rejects, run_convert
    from test_pass_through import FLAGS, mixed, shard_records, write_records

    from audit.validate import validate

    records = mixed(40)
    path = str(tmp_path / "in" / "g.tfrecord.gz")
    write_records(path, records)
    write_records(str(tmp_path / "in" / "ok.tfrecord"), mixed(10, seed=1))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        flipped = f.read(1)[0] ^ 0xFF
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([flipped]))
    runs = []
    for mode in (
        ["--direct_running_mode=in_memory"],
        ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    ):
        out = str(tmp_path / mode[0].split("=")[1])
        info = run_convert(
            str(tmp_path / "in"), out, *FLAGS, *mode, "--max_reject_fraction=0.5", validated=False
        )
        rejects = read_rejects(out)
        kept = [r for split in shard_records(out).values() for r in split if r in records]
        written = sum(s["num_examples"] for s in info["splits"].values())
        stretches = [r for r in rejects if "hold no readable record" in r["detail"]]
        if stretches:
            # zlib decoded on, into bytes the flip changed over a stretch that hides how
            # many records it held: a reject names the stretch from its first byte (and
            # the records after it are keyed FILE@BYTE); every record before it is kept,
            # and the counts reconcile
            def skipped_from(r):
                return int(re.search(r"bytes (\d+) to \d+", r["detail"]).group(1))

            first = min(stretches, key=skipped_from)
            start = skipped_from(first)
            assert first["reason"] == "corrupt"
            before = [r for r, o in zip(records, _offsets(records)) if o + len(r) + 16 <= start]
            assert set(before) <= set(kept) and 0 < len(before) < len(records)
            assert info["inputs"] == written + len(rejects) == len(kept) + 10 + len(rejects)
            assert validate(out, full=True) == []
            shas = [
                s["sha256"] for n in sorted(info["splits"]) for s in info["splits"][n]["shards"]
            ]
            runs.append((first, shas))
            continue
        reject, *after = sorted(rejects, key=lambda r: int(r["key"].split("#")[1]))
        bad = int(reject["key"].split("#")[1])
        assert 0 < bad < len(records) and reject["reason"] == "corrupt"
        assert reject["key"] == f"g.tfrecord.gz#{bad}"
        assert reject["detail"].startswith(f"record {bad} (byte {_offsets(records)[bad]}): ")
        if after:  # zlib decoded on: the records after the damaged one are kept
            [trailer] = after
            assert trailer["key"] == f"g.tfrecord.gz#{len(records)}"
            assert "incorrect data check" in trailer["detail"]
            assert sorted(kept) == sorted(records[:bad] + records[bad + 1 :])
        else:  # zlib stopped at the damage: nothing after it can be decompressed
            assert "gzip stream is damaged" in reject["detail"]
            assert sorted(kept) == sorted(records[:bad])
        assert info["inputs"] == written + 1 + len(after) == len(kept) + 10 + 1 + len(after)
        assert validate(out, full=True) == []
        runs.append(
            (
                reject,
                [s["sha256"] for n in sorted(info["splits"]) for s in info["splits"][n]["shards"]],
            )
        )
    assert runs[0] == runs[1]
