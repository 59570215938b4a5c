"""Pass-through records read back by every face (issue 42, item 2): the features parsed
(``reader.examples``: the inferred schema's spec, or ``features=``; nothing decoded),
every record exactly once, in the reader's one order, resumable (also elastically),
mixable; image options and DALI refused in one line.

The dataset is made once by a real convert of Examples TensorFlow wrote
(``tests/dataset_writer.py`` writes no record inputs)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from conftest import run_convert
from test_pass_through import FLAGS, as_python, mixed, write_records

import reader
from reader.examples import Feature, Padded

N = 36  # records, in 6 shards: 3 workers read 2 shards each


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    base = tmp_path_factory.mktemp("read")
    recs = mixed(N)
    write_records(str(base / "in" / "a.tfrecord"), recs)
    out = str(base / "out")
    run_convert(
        str(base / "in"),
        out,
        *FLAGS,
        "--num_shards=6",
        "--label_feature=label",
        "--key_feature=id",
        "--splits=train=1",
    )
    return out, {as_python(r)["id"][0]: as_python(r) for r in recs}


def _host(v):
    return v.numpy() if hasattr(v, "numpy") else np.asarray(v)


def _rows(batch: dict) -> list[dict]:
    """A batch of parsed features as one {name: list of values} a record (the padding
    rows of a masked batch left out); ``label`` the id, ``key`` the text."""
    mask = _host(batch["mask"]) if "mask" in batch else None
    keys = [k.decode() if isinstance(k, bytes) else k for k in _host(batch["key"])]
    rows = []
    for i in range(len(keys)):
        if mask is not None and not mask[i]:
            continue
        row = {"key": keys[i]}
        for name, value in batch.items():
            if name in ("mask", "key"):
                continue
            if isinstance(value, Padded):
                k = int(_host(value.lengths)[i])
                row[name] = _host(value.values)[i][:k].tolist()
            else:
                row[name] = _host(value)[i].reshape(-1).tolist()
        rows.append(row)
    return rows


LABELS = ["cat", "dog"]  # labels.txt: the label feature's texts, sorted


def _check_once(rows: list[dict], written: dict) -> None:
    ids = collections.Counter(r["key"] for r in rows)
    assert ids == collections.Counter(k.decode() for k in written)  # every record once
    for r in rows:
        expected = {k: v for k, v in written[r["key"].encode()].items() if v}
        expected["label"] = [LABELS.index(expected["label"][0].decode())]  # the id
        expected["key"] = r["key"]
        assert {k: v for k, v in r.items() if v or k == "label"} == expected


def _ids(rows: list[dict]) -> list[str]:
    return [r["key"] for r in rows]


def _tf_rows(out, **kw) -> list[dict]:
    return [r for b in reader.make_dataset(out, "train", **kw) for r in _rows(b)]


def test_make_dataset_gives_the_parsed_features_once(converted):
    out, written = converted
    ds = reader.make_dataset(out, "train", batch_size=5, shuffle=False, pad_final_batch=True)
    batches = list(ds)
    assert len(batches) == 8 and _host(batches[-1]["mask"]).tolist() == [True] + [False] * 4
    assert _host(batches[-1]["tokens"].lengths)[1:].tolist() == [0] * 4  # padding: zeros
    assert batches[0]["embedding"].shape == (5, 3) and batches[0]["label"].dtype.name == "int64"
    _check_once([r for b in batches for r in _rows(b)], written)


def test_numpy_and_torch_readers_give_the_same_order_and_values(converted):
    import torch

    from reader.torch import TorchReader

    out, written = converted
    tf_rows = _tf_rows(out, batch_size=4, seed=3)
    np_rows = [r for b in reader.NumpyReader(out, "train", batch_size=4, seed=3) for r in _rows(b)]
    assert np_rows == tf_rows  # the same order, the same values
    _check_once(np_rows, written)
    for backend in ("tf", "python"):
        torch_batches = list(TorchReader(out, "train", 4, seed=3, backend=backend))
        tokens = torch_batches[0]["tokens"]
        assert isinstance(tokens, Padded) and tokens.lengths.dtype.is_floating_point is False
        assert isinstance(tokens.values, torch.Tensor) and torch_batches[0]["blob"].dtype == object
        assert [r for b in torch_batches for r in _rows(b)] == tf_rows, backend


def test_padded_evaluation_is_the_same_on_every_face(converted):
    from reader.torch import TorchReader

    out, _ = converted
    kw = dict(shuffle=False, pad_final_batch=True, num_workers=4, worker_index=3)
    tf_batches = list(reader.make_dataset(out, "train", 4, **kw))
    np_batches = list(reader.NumpyReader(out, "train", 4, **kw))
    torch_batches = list(TorchReader(out, "train", 4, backend="python", **kw))
    assert len(tf_batches) == len(np_batches) == len(torch_batches) >= 2
    for t, n, p in zip(tf_batches, np_batches, torch_batches):
        assert _host(t["mask"]).tolist() == n["mask"].tolist() == p["mask"].tolist()
        assert _rows(t) == _rows(n) == _rows(p)
        assert (_host(t["tokens"].values) == n["tokens"].values).all()


def test_single_examples_without_a_batch_size(converted):
    out, written = converted
    ds = reader.make_dataset(out, "train", batch_size=None, shuffle=False)
    one = next(iter(ds))
    assert one["embedding"].shape == (3,) and one["tokens"].values.shape.rank == 1
    assert one["key"].numpy().decode() in {k.decode() for k in written}


def test_a_resumed_read_continues_where_it_stopped(converted):
    out, _ = converted
    whole = _tf_rows(out, batch_size=4, seed=1)
    state = reader.ReadState(seed=1, batch_size=4).advance(2)
    ds, _ = reader.resume(out, "train", state)
    assert _ids(r for b in ds for r in _rows(b)) == _ids(whole[8:])
    numpy = reader.NumpyReader(out, "train", 4, seed=1)
    batches = iter(numpy)
    [next(batches) for _ in range(2)]
    saved = numpy.state_dict()
    again = reader.NumpyReader(out, "train", 4, seed=1)
    again.load_state_dict(saved)
    assert _ids(r for b in again for r in _rows(b)) == _ids(whole[8:])


def test_an_elastic_resume_from_3_to_2_workers_reads_each_record_once(converted):
    out, written = converted
    kw = dict(seed=4, cycle_length=2)
    before = []
    for w in range(3):  # each of 3 workers read 2 batches of 2, then the run stopped
        ds = reader.make_dataset(out, "train", 2, num_workers=3, worker_index=w, **kw)
        before += [r for b in list(ds)[:2] for r in _rows(b)]
    state = reader.ReadState(seed=4, batch_size=2, step=2, num_workers=3)
    after = []
    for w in range(2):
        ds, _ = reader.resume(out, "train", state, num_workers=2, worker_index=w, **kw)
        after += [r for b in ds for r in _rows(b)]
    numpy = reader.NumpyReader(out, "train", 2, num_workers=2, worker_index=1, state=state, **kw)
    assert [r for b in numpy for r in _rows(b)] == [
        r
        for b in reader.resume(out, "train", state, num_workers=2, worker_index=1, **kw)[0]
        for r in _rows(b)
    ]
    _check_once(before + after, written)


def test_a_mix_of_a_pass_through_dataset_with_itself(converted, tmp_path):
    out, written = converted
    both = reader.mix([((out, "train"), 0.5), ((out, "train"), 0.5)])
    rows = _tf_rows_of(both)
    assert collections.Counter(_ids(rows)) == {k.decode(): 2 for k in written}
    assert [r for b in reader.NumpyReader(both, batch_size=4, seed=0) for r in _rows(b)] == rows


def _tf_rows_of(data) -> list[dict]:
    return [r for b in reader.make_dataset(data, batch_size=4, seed=0) for r in _rows(b)]


def test_a_mix_with_an_image_dataset_is_one_line(converted, tmp_path):
    from dataset_writer import write_dataset

    from evenshard import synthetic

    out, _ = converted
    synthetic.make_image_folder(str(tmp_path / "img"), num_labels=2, per_label=3)
    write_dataset(str(tmp_path / "img"), str(tmp_path / "images"), "--splits=train=1.0")
    mixed_kinds = reader.mix([((out, "train"), 0.5), ((str(tmp_path / "images"), "train"), 0.5)])
    with pytest.raises(ValueError, match="record kind") as e:
        reader.make_dataset(mixed_kinds, batch_size=4, seed=0)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="features= parses records that are not images"):
        reader.make_dataset(str(tmp_path / "images"), features={"id": Feature("bytes", (1,))})


@pytest.mark.parametrize(
    "face, option, value",
    [
        ("make_dataset", "image_size", 224),
        ("NumpyReader", "random_flip", True),
        ("TorchReader", "image_size", (8, 8)),
        ("make_dataset", "as_supervised", True),
    ],
)
def test_an_image_option_is_refused_in_one_line(converted, face, option, value):
    from reader.torch import TorchReader

    out, _ = converted
    make = {"make_dataset": reader.make_dataset, "NumpyReader": reader.NumpyReader}
    make["TorchReader"] = TorchReader
    with pytest.raises(ValueError, match=f"not images.*does not honour {option}") as e:
        make[face](out, "train", 4, **{option: value})
    assert "\n" not in str(e.value)


def test_dali_refuses_records_that_are_not_images(converted):
    from reader.torch import TorchReader
    from schemas.info import DatasetError

    out, _ = converted
    with pytest.raises(DatasetError, match="DALI decodes images.*not images"):
        TorchReader(out, "train", 4, backend="dali")
    with pytest.raises((DatasetError, ImportError), match="decodes images|DALI"):
        reader.make_dali_pipeline(out, "train", 4)


def test_features_given_are_the_features_read(converted):
    import tensorflow as tf

    out, written = converted
    spec = {
        "embedding": tf.io.FixedLenFeature([3], tf.float32),
        "tags": tf.io.VarLenFeature(tf.string),
        "weight": Feature("float"),
    }
    for batches in (
        reader.make_dataset(out, "train", 6, shuffle=False, features=spec),
        reader.NumpyReader(out, "train", 6, shuffle=False, features=spec),
    ):
        for b in batches:
            assert set(b) - {"mask"} == {"embedding", "tags", "weight", "label", "key"}
            for r in _rows(b):
                record = written[r["key"].encode()]
                assert r["tags"] == record["tags"] and r["weight"] == record.get("weight", [])
                assert r["embedding"] == record["embedding"]
    with pytest.raises(ValueError, match="feature 'mask'"):
        reader.make_dataset(out, "train", 6, features={"mask": Feature("int64")})


def test_excluded_keys_come_as_padding_rows(converted):
    out, _ = converted
    whole = _tf_rows(out, batch_size=4, seed=1)
    gone = sorted(_ids(whole[8:12]))
    state = reader.ReadState(seed=1, batch_size=4).advance(2).exclude(gone)
    ds, _ = reader.resume(out, "train", state)
    tf_rows = [r for b in ds for r in _rows(b)]
    assert _ids(tf_rows) == [k for k in _ids(whole[8:]) if k not in gone]
    numpy = reader.NumpyReader(out, "train", 4, state=state)
    assert _ids(r for b in numpy for r in _rows(b)) == _ids(tf_rows)


def test_a_damaged_record_is_skipped_alike_by_numpy_reader_and_make_dataset(converted, tmp_path):
    import json
    import shutil

    from reader.values.split_shards import load_index, split_shards

    out, written = converted
    bad = str(tmp_path / "bad")
    shutil.copytree(out, bad)
    shard = {**split_shards(reader.load_info(bad), bad, "train")[0]}
    offset, size = (int(v) for v in load_index(shard)[2])
    with open(shard["path"], "r+b") as f:  # a flipped byte in record 2's data: its CRC fails
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    whole = _tf_rows(out, batch_size=4, seed=2)
    faces = (
        ("numpy", lambda **kw: reader.NumpyReader(bad, "train", 4, seed=2, **kw)),
        ("tf", lambda **kw: reader.make_dataset(bad, "train", 4, seed=2, num_processes=0, **kw)),
    )
    for name, face in faces:
        ledger = str(tmp_path / f"{name}.jsonl")
        rows = [r for b in face(on_error="skip", error_ledger=ledger) for r in _rows(b)]
        with open(ledger) as f:
            lines = [json.loads(line) for line in f]
        assert [(x["shard"], x["offset"]) for x in lines] == [(shard["path"], offset)], name
        assert len(rows) == len(whole) - 1 and all(r in whole for r in rows), name
        assert [r for r in whole if r not in rows][0]["key"] not in _ids(rows)


def test_a_dataset_without_label_and_key_features_gives_neither(tmp_path):
    recs = mixed(12, seed=1)
    write_records(str(tmp_path / "in" / "a.tfrecord"), recs)
    out = str(tmp_path / "out")
    run_convert(str(tmp_path / "in"), out, *FLAGS, "--splits=train=1")
    written = sorted(as_python(r)["id"][0] for r in recs)
    tf_batches = list(reader.make_dataset(out, "train", 5, shuffle=False, pad_final_batch=True))
    np_batches = list(reader.NumpyReader(out, "train", 5, shuffle=False, pad_final_batch=True))
    for batches in (tf_batches, np_batches):
        assert set(batches[0]) == {"id", "label", "tokens", "embedding", "blob", "tags"} | {
            "weight",
            "mask",
        }  # "label" here is the feature of that name, as written (no label feature named)
        ids = [i[0] for b in batches for i, m in zip(_host(b["id"]), _host(b["mask"])) if m]
        assert sorted(ids) == written
    assert [_host(b["id"]).tolist() for b in tf_batches] == [b["id"].tolist() for b in np_batches]
    with pytest.raises(ValueError, match="without --key_feature"):
        reader.resume(out, "train", reader.ReadState(0, 5).exclude(["ex-1"]), shuffle=False)


def test_explain_names_each_batch_s_records_by_their_key_feature(converted):
    from reader.explain import explain

    out, _ = converted
    whole = [_ids(_rows(b)) for b in reader.make_dataset(out, "train", 4, seed=5)]
    said = explain(out, "train", 4, steps=range(len(whole)), seed=5)
    assert [s["key"] for s in said] == whole
    state = reader.ReadState(seed=5, batch_size=4, step=2, num_workers=3)
    for w in range(2):  # an elastic resume's batches too
        ds, _ = reader.resume(out, "train", state, num_workers=2, worker_index=w)
        got = [_ids(_rows(b)) for b in ds]
        said = explain(
            out,
            "train",
            4,
            steps=range(2, 2 + len(got)),
            state=state,
            num_workers=2,
            worker_index=w,
        )
        assert [s["key"] for s in said] == got


def test_a_transform_is_refused_and_torch_reads_them_on_the_python_route_even_on_a_gpu(converted):
    from reader.routes.torch_backend import default_backend
    from schemas.dataset_info import load_dataset_info

    out, _ = converted
    with pytest.raises(ValueError, match="transform= and views= run on decoded images") as e:
        reader.NumpyReader(out, "train", 4, transform=_same, num_processes=0)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="run on decoded images"):
        reader.make_dataset(out, "train", 4, views=2, num_processes=0)
    assert default_backend([load_dataset_info(out)], gpu=True) == "python"


def _same(example, rng):
    return example
