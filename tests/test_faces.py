"""The faces over the one spine: one return type each (``make_dataset`` a dataset,
``reader.resume`` the pair), the old ``state=`` form kept one release with a warning
saying what to write, and no internal keyword in a face's signature."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic

KW = dict(image_size=(8, 8))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces")
    synthetic.make_image_folder(str(root / "in"), num_labels=2, per_label=8, formats=("png",))
    out = str(root / "out")
    write_dataset(str(root / "in"), out, "--num_shards=2")
    return out


def batches(ds) -> list[dict]:
    return [{k: v.numpy() for k, v in b.items()} for b in ds]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


def test_make_dataset_with_state_warns_what_to_write_and_gives_what_resume_gives(data):
    state = reader.ReadState(seed=3, batch_size=2).advance(2)
    with pytest.warns(DeprecationWarning) as caught:
        old, old_state = reader.make_dataset(data, "train", 2, state=state, seed=3, **KW)
    (warning,) = [w for w in caught if "make_dataset" in str(w.message)]
    message = str(warning.message)
    assert "\n" not in message and warning.filename == __file__
    assert "dataset, state = reader.resume(data_dir, split, state, batch_size=batch_size" in message
    new, new_state = reader.resume(data, "train", state, seed=3, **KW)
    assert old_state == new_state
    got = batches(old)
    assert got and same(got, batches(new))
    # the resumed read is the uninterrupted one from batch 2 on
    assert same(got, batches(reader.make_dataset(data, "train", 2, seed=3, **KW))[2:])


def test_make_dataset_returns_a_dataset_alone_without_a_warning(data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = reader.make_dataset(data, "train", 2, **KW)
    assert not [w for w in caught if "make_dataset" in str(w.message)]
    assert not isinstance(ds, tuple) and len(batches(ds)) == len(ds)


def test_the_internal_deal_keyword_is_no_longer_make_dataset_s(data):
    assert "deal" not in inspect.signature(reader.make_dataset).parameters
    with pytest.raises(TypeError, match="'deal' is not a read option"):
        reader.make_dataset(data, "train", 2, deal=(2, 0), **KW)


def flip(example, rng):  # at the top level: it is pickled
    return {**example, "image": example["image"][:, ::-1]}


def test_resume_with_a_transform_gives_the_pair_too(data):
    state = reader.ReadState(seed=1, batch_size=2).advance(1)
    kw = dict(transform=flip, num_processes=0, seed=1, **KW)
    ds, start = reader.resume(data, "train", state, **kw)
    assert (start.seed, start.step, start.batch_size) == (1, 1, 2)
    whole = batches(reader.make_dataset(data, "train", 2, **kw))
    assert same(batches(ds), whole[1:])


def test_num_processes_reads_make_dataset_through_the_engine(data):
    """``make_dataset(num_processes=N)``: the engine's batches (NumpyReader's, as a
    tf.data dataset) for any N; the graph route's images, keys and order."""
    kw = dict(seed=3, epochs=1, **KW)
    graph = batches(reader.make_dataset(data, "train", 4, **kw))
    engine = {
        n: batches(reader.make_dataset(data, "train", 4, num_processes=n, **kw)) for n in (0, 2)
    }
    numpy = list(reader.NumpyReader(data, "train", 4, num_processes=0, **kw))
    assert same(engine[0], engine[2])
    for b, e, n in zip(graph, engine[0], numpy, strict=True):
        assert "view" in e and "view" not in b  # the engine's dict, not the graph's
        assert np.array_equal(e["image"], n["image"]) and np.array_equal(b["image"], e["image"])
        assert list(b["key"]) == list(e["key"])


def test_num_processes_is_refused_with_the_tf_backend(data):
    from reader.torch import TorchReader

    with pytest.raises(ValueError, match="num_processes= run on the Python route"):
        TorchReader(data, "train", 4, backend="tf", num_processes=2, **KW)


def test_decode_false_with_num_processes_says_what_to_leave_out(data):
    """``make_dataset(decode=False, num_processes=N)``: the Python route decodes every
    image; the refusal names num_processes= as what sent the read there, not only
    ``make_dataset(decode=False)``, which is what was called."""
    with pytest.raises(ValueError) as raised:
        reader.make_dataset(data, "train", 4, decode=False, num_processes=2)
    message = str(raised.value)
    assert "\n" not in message and "num_processes=" in message and "without" in message


def test_each_route_s_batch_fields_are_the_readme_s(data):
    """README, "Read": the graph's {image, label, key} (+ mask with pad_final_batch);
    the Python route's mask, epoch and view always; TorchReader(backend="tf")'s mask
    always."""
    from reader.torch import TorchReader

    def fields(face) -> list[str]:
        batches = iter(face)
        try:
            return sorted(next(batches))
        finally:  # the read ended now: its processes and blocks with it
            if hasattr(batches, "close"):
                batches.close()

    graph = ["image", "key", "label"]
    python = sorted(graph + ["mask", "epoch", "view"])
    assert fields(reader.make_dataset(data, "train", 2, **KW)) == graph
    padded = reader.make_dataset(data, "train", 2, shuffle=False, pad_final_batch=True, **KW)
    assert fields(padded) == graph + ["mask"]
    assert fields(reader.make_dataset(data, "train", 2, num_processes=0, **KW)) == python
    assert fields(reader.NumpyReader(data, "train", 2, num_processes=0, **KW)) == python
    assert fields(TorchReader(data, "train", 2, backend="python", num_processes=0, **KW)) == python
    assert fields(TorchReader(data, "train", 2, backend="tf", **KW)) == graph + ["mask"]
    by_default = TorchReader(data, "train", 2, **KW)  # the engine on the CPU
    assert by_default.backend == "python" and fields(by_default) == python


def test_the_python_route_s_dataset_knows_its_batch_size_when_every_batch_is_full(data, tmp_path):
    """As the graph's: a fixed batch dimension with drop_remainder or pad_final_batch
    (Keras and XLA compile one shape), None otherwise."""

    def rows(**options) -> set:
        ds = reader.make_dataset(data, "train", 3, num_processes=0, **options, **KW)
        graph = reader.make_dataset(data, "train", 3, **options, **KW)
        assert ds.element_spec["image"].shape[0] == graph.element_spec["image"].shape[0]
        return {spec.shape[0] for spec in ds.element_spec.values()}

    assert rows(drop_remainder=True) == {3}
    assert rows(shuffle=False, pad_final_batch=True) == {3}
    assert rows() == {None}
    ledger = dict(on_error="skip", error_ledger=str(tmp_path / "skipped.jsonl"))
    skipping = reader.make_dataset(data, "train", 3, drop_remainder=True, **ledger, **KW)
    assert skipping.element_spec["image"].shape[0] == 3  # a skipped row stays, masked


def test_an_engine_dataset_dropped_unread_ends_the_pass_its_signature_began(data):
    """make_dataset on the engine reads its first batch for the signature; a dataset
    dropped before it is iterated ends that pass (its processes and shared blocks), not
    TensorFlow's registry of generators at the exit."""
    import gc
    import os
    import re

    owner = re.compile(rf"evenshard-[0-9a-f]{{12}}-{os.getpid()}-")

    def blocks() -> set:
        return {n for n in os.listdir("/dev/shm") if owner.match(n)}

    before = blocks()
    ds = reader.make_dataset(data, "train", 2, num_processes=2, **KW)
    assert blocks() - before  # the pass begun: its blocks
    del ds
    gc.collect()
    assert not blocks() - before
    again = reader.make_dataset(data, "train", 2, num_processes=2, **KW)
    assert same(batches(again), batches(again))  # each pass the same batches


def _as_is(example, rng):
    return example


def test_ctrl_c_in_a_read_of_full_batches_ends_it_as_without_them(data, monkeypatch):
    """Ctrl-C in the read: the dataset yields a batch that lets a caller waiting in
    TensorFlow out, then says the read was interrupted; with a fixed batch dimension
    (drop_remainder) that batch has its rows, all padding, not none (which broke the
    spec: "yielded an element of shape (0,)")."""
    import tensorflow as tf

    from reader.routes import python_route

    whole = python_route.PythonRoute.__iter__

    def interrupted(self):
        batches = whole(self)
        try:
            yield next(batches)
            raise KeyboardInterrupt
        finally:
            batches.close()

    monkeypatch.setattr(python_route.PythonRoute, "__iter__", interrupted)
    ds = reader.make_dataset(
        data, "train", 3, num_processes=0, drop_remainder=True, transform=_as_is, **KW
    )
    assert ds.element_spec["image"].shape[0] == 3
    got = []
    with pytest.raises(tf.errors.OpError, match=r"the read was interrupted \(Ctrl-C\)"):
        for batch in ds:
            got.append(batch)
    assert len(got) == 2 and got[-1]["image"].shape[0] == 3
    assert not got[-1]["mask"].numpy().any()  # every row padding


def test_as_supervised_gives_the_same_tuples_on_the_graph_and_in_processes(data, tmp_path):
    """(image, label) on both routes; (image, label, weight) where a row can be masked
    (``pad_final_batch``; ``on_error="skip"`` on the Python route): code written
    ``for x, y in ds`` runs whichever route the options take."""

    def arity(**options) -> set:
        return {
            len(ds.element_spec)
            for ds in (
                reader.make_dataset(data, "train", 3, as_supervised=True, **options, **KW),
                reader.make_dataset(
                    data, "train", 3, as_supervised=True, num_processes=0, **options, **KW
                ),
            )
        }

    assert arity() == {2}
    assert arity(shuffle=False, pad_final_batch=True) == {3}
    ledger = str(tmp_path / "skipped.jsonl")
    skipping = reader.make_dataset(
        data, "train", 3, as_supervised=True, on_error="skip", error_ledger=ledger, **KW
    )
    assert len(skipping.element_spec) == 3
