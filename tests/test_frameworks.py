"""DALI, PyTorch and JAX readers (issue 12): the tf.data reader's guarantees, on the CPU here."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from conftest import script_outcomes
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.dali import make_dali_pipeline
from reader.torch import TorchReader

SIZE = (16, 16)


@pytest.fixture(scope="module")
def data_761(tmp_path_factory):
    """761 examples (prime), every format DALI decodes: "eval" (3 shards) and a copy as
    "train" (6 shards); and a dataset with GIFs."""
    root = tmp_path_factory.mktemp("fw") / "images"
    synthetic.make_image_folder(
        str(root), num_labels=4, per_label=190, formats=("jpeg", "png", "bmp", "webp")
    )
    (root / "label_0" / "extra.png").write_bytes(
        synthetic.image_bytes("png", 20, 20, np.random.default_rng(1))
    )
    out = tmp_path_factory.mktemp("fw_out")
    write_dataset(str(root), str(out / "eval"), "--splits=eval=1.0", "--num_shards=3")
    write_dataset(str(root), str(out / "train"), "--splits=train=1.0", "--num_shards=6")
    gif = tmp_path_factory.mktemp("fw_gif") / "images"
    synthetic.make_image_folder(str(gif), num_labels=2, per_label=10, formats=("jpeg", "gif"))
    write_dataset(str(gif), str(out / "gif"), "--splits=train=1.0")
    return str(out / "eval"), str(out / "train"), str(out / "gif")


def tf_keys(data_dir, split, batch_size, **kw) -> list[list[str]]:
    ds = reader.make_dataset(data_dir, split, batch_size, image_size=SIZE, **kw)
    return [[k.decode() for k in b["key"].numpy()] for b in ds]


NAMES = ("dali", "torch-dali", "torch-tf")


def reader_named(name, data_dir, split, batch_size, **kw):
    """The DALI pipeline ("dali") or a TorchReader ("torch-BACKEND")."""
    if name == "dali":
        return make_dali_pipeline(data_dir, split, batch_size, image_size=SIZE, **kw)
    backend = name.split("-")[1]
    return TorchReader(data_dir, split, batch_size, image_size=SIZE, backend=backend, **kw)


def readers(data_dir, split, batch_size, **kw):
    for name in NAMES:
        yield name, reader_named(name, data_dir, split, batch_size, **kw)


def as_numpy(batch) -> dict:
    return {k: v if isinstance(v, list) else np.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("workers", [1, 3])
def test_exact_once_evaluation(data_761, workers):
    """761 keys once, no more: padded batches, masks, equal batch counts per worker."""
    kws = [
        dict(shuffle=False, pad_final_batch=True, num_workers=workers, worker_index=w)
        for w in range(workers)
    ]
    wants = [tf_keys(data_761[0], "eval", 32, **kw) for kw in kws]  # read once, for each face
    for name in NAMES:
        seen, counts = [], []
        for kw, want in zip(kws, wants):
            r = reader_named(name, data_761[0], "eval", 32, **kw)
            batches = [as_numpy(b) for b in r]
            counts.append(len(batches))
            assert len(batches) == len(r)
            for b in batches:
                assert b["image"].shape == (32, *SIZE, 3) and b["image"].dtype == np.uint8
                assert b["mask"].shape == (32,)
                seen += [k for k, m in zip(b["key"], b["mask"]) if m]
                assert not b["image"][~b["mask"]].any()  # padding is zeros
            # the same keys, in the same order, as the tf.data reader
            assert [[k for k in b["key"] if k] for b in batches] == [
                [k for k in b if k] for b in want
            ]
        assert len(set(counts)) == 1, (name, counts)
        assert len(seen) == len(set(seen)) == 761, name


def test_seeded_order_repeats_and_changes_every_epoch(data_761):
    want = [
        k
        for b in tf_keys(data_761[1], "train", 64, seed=4, epochs=2, drop_remainder=True)
        for k in b
    ]
    for name, r in readers(data_761[1], "train", 64, seed=4, epochs=2, drop_remainder=True):
        keys = [k for b in r for k in b["key"]]
        again = [
            k
            for b in reader_named(name, data_761[1], "train", 64, seed=4, epochs=2)
            for k in b["key"]
        ]
        assert keys == again[: len(keys)], name
        first, second = again[:761], again[761:]
        assert collections.Counter(first) == collections.Counter(second), name
        assert first != second, name
        assert keys == want, name


def test_workers_read_disjoint_files_with_equal_steps(data_761):
    parts, steps = [], []
    for w in range(3):
        r = make_dali_pipeline(
            data_761[1],
            "train",
            16,
            image_size=SIZE,
            seed=1,
            num_workers=3,
            worker_index=w,
            drop_remainder=True,
        )
        keys = [k for b in r for k in b["key"]]
        parts.append(set(keys))
        steps.append(len(r))
    assert len(set(steps)) == 1
    assert not (parts[0] & parts[1]) and not (parts[1] & parts[2])


def test_torch_ranks_come_from_the_environment(data_761, monkeypatch):
    seen = []
    for rank in range(2):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        r = TorchReader(
            data_761[0],
            "eval",
            32,
            image_size=SIZE,
            shuffle=False,
            pad_final_batch=True,
            backend="tf",
        )
        assert r.options.num_workers == 2 and r.options.worker_index == rank
        seen += [k for b in r for k, m in zip(b["key"], b["mask"].tolist()) if m]
    assert len(seen) == len(set(seen)) == 761


def test_dali_and_torch_resume_mid_epoch(data_761):
    kw = dict(seed=9, epochs=2)
    for name, r in readers(data_761[1], "train", 32, **kw):
        whole = [b["key"] for b in r]
        tail = [b["key"] for b in reader_named(name, data_761[1], "train", 32, start_step=30, **kw)]
        assert tail == whole[30:], name


def test_every_face_saves_and_resumes_with_state_dict(data_761):
    """One protocol on every face (torchdata's names): a read left after 7 batches,
    its ``state_dict()`` loaded by a new reader with ``load_state_dict()``, goes on
    with batch 7; before, DALI's face had a ``state`` attribute alone."""
    import reader

    kw = dict(seed=9, epochs=2)

    def make(name):
        if name == "numpy":
            return reader.NumpyReader(
                data_761[1], "train", 32, image_size=SIZE, num_processes=0, **kw
            )
        return reader_named(name, data_761[1], "train", 32, **kw)

    for name in (*NAMES, "numpy"):
        first = make(name)
        whole, saved = [], None
        for i, batch in enumerate(first):
            whole.append(list(batch["key"]))
            if i == 6:
                saved = first.state_dict()
        again = make(name)
        again.load_state_dict(saved)
        assert [list(b["key"]) for b in again] == whole[7:], name


def _train(reader_, model, optimizer, steps: int) -> list[float]:
    import torch

    losses = []
    for batch in reader_:
        x = batch["image"].float().permute(0, 3, 1, 2) / 255
        loss = torch.nn.functional.cross_entropy(model(x), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 6))
        if len(losses) == steps:
            break
    return losses


def test_a_preempted_torch_training_resumes_with_the_same_losses(data_761):
    """A tiny CNN trained 40 steps straight, and trained 15 steps, preempted (the model's and
    the reader's state_dict saved), then resumed by a new reader: the same losses."""
    import torch

    def fresh():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 4),
        )
        return model, torch.optim.SGD(model.parameters(), lr=0.5)

    kw = dict(image_size=SIZE, seed=5, epochs=None, backend="tf")
    model, opt = fresh()
    straight = _train(TorchReader(data_761[1], "train", 32, **kw), model, opt, 40)
    model, opt = fresh()
    first = TorchReader(data_761[1], "train", 32, **kw)
    losses = _train(first, model, opt, 15)
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "data": first.state_dict()}
    model, opt = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    second = TorchReader(data_761[1], "train", 32, **kw)
    second.load_state_dict(saved["data"])
    losses += _train(second, model, opt, 25)
    assert losses == straight
    assert straight[-1] < straight[0]  # it learns


def test_images_match_the_tf_reader(data_761):
    """Same pixels as TensorFlow's decoders, up to resize filter differences (JPEG/PNG/BMP/WebP)."""
    dali = next(
        iter(make_dali_pipeline(data_761[0], "eval", 64, image_size=(20, 20), shuffle=False))
    )
    tf_batch = next(
        iter(reader.make_dataset(data_761[0], "eval", 64, image_size=(20, 20), shuffle=False))
    )
    diff = np.abs(dali["image"].astype(int) - tf_batch["image"].numpy().astype(int))
    assert diff.mean() < 12, diff.mean()


def test_gif_datasets_are_refused_with_the_fix(data_761):
    with pytest.raises(reader.DatasetError, match="gif images, which DALI cannot decode"):
        make_dali_pipeline(data_761[2], "train", 8, image_size=SIZE)
    with pytest.raises(reader.DatasetError, match="gif"):
        TorchReader(data_761[2], "train", 8, image_size=SIZE, backend="dali")
    assert TorchReader(data_761[2], "train", 8, image_size=SIZE).backend == "python"


def test_torch_default_backend_is_the_faster_for_the_machine(data_761):
    """Issue 31.3: DALI by default only where a GPU is visible (on the CPU it read 600
    img/s against the tf backend's 1,309); asked for, it still reads on the CPU. Else
    the read engine (the Python route: less CPU an image than tf.data's graph, and no
    TensorFlow in the process); "tf" where it is asked for."""
    import torch

    from reader.dali import installed
    from reader.routes.torch_backend import default_backend as _default_backend

    assert installed()  # DALI is there: the CPU alone keeps it from being the default
    if torch.cuda.device_count():
        pytest.skip("a GPU is visible here: the default is DALI")
    plain = TorchReader(data_761[0], "eval", 64, image_size=SIZE)
    assert plain.backend == "python"
    assert TorchReader(data_761[0], "eval", 64, image_size=SIZE, backend="tf").backend == "tf"
    explicit = TorchReader(data_761[0], "eval", 64, image_size=SIZE, backend="dali")
    assert explicit.backend == "dali" and next(iter(explicit))["image"].shape == (64, *SIZE, 3)
    infos = [s.info for s in explicit._read.passes.sources]
    assert _default_backend(infos, gpu=True) == "dali"
    assert _default_backend(infos, gpu=False) == "python"
    gif = [
        s.info for s in TorchReader(data_761[2], "train", 8, image_size=SIZE)._read.passes.sources
    ]
    assert _default_backend(gif, gpu=True) == "python"  # a GPU, but GIFs DALI cannot decode


def test_torch_layout_and_dataloader(data_761):
    import torch

    r = TorchReader(
        data_761[0], "eval", 32, image_size=SIZE, shuffle=False, layout="NCHW", backend="tf"
    )
    loader = torch.utils.data.DataLoader(r, batch_size=None)
    first = next(iter(loader))
    assert first["image"].shape == (32, 3, *SIZE) and first["label"].dtype == torch.int64


@pytest.mark.parametrize("backend", ["tf", "dali"])
def test_torch_as_supervised_gives_tuples(data_761, backend):
    """(image, label) for a training loop; with pad_final_batch, (image, label, mask)."""
    kw = dict(image_size=SIZE, shuffle=False, backend=backend)
    dicts = list(TorchReader(data_761[0], "eval", 64, **kw))
    pairs = list(TorchReader(data_761[0], "eval", 64, as_supervised=True, **kw))
    assert len(pairs) == len(dicts)
    for (image, label), d in zip(pairs, dicts):
        assert (image == d["image"]).all() and (label == d["label"]).all()
    image, label, mask = list(
        TorchReader(data_761[0], "eval", 64, as_supervised=True, pad_final_batch=True, **kw)
    )[-1]
    assert image.shape[0] == label.shape[0] == 64 and 0 < int(mask.sum()) < 64


def test_backends_refuse_the_options_they_do_not_honour(data_761):
    """Each option a reader would silently ignore is named in a ValueError."""
    for option, value in [
        ("as_supervised", True),
        ("cache", True),
        ("prefetch", 4),
        ("prefetch_to_device", "/gpu:0"),
        ("num_parallel_calls", 8),
        ("deterministic", False),
    ]:
        with pytest.raises(ValueError, match=option):
            make_dali_pipeline(data_761[0], "eval", 8, image_size=SIZE, **{option: value})
    with pytest.raises(ValueError, match="cache"):
        TorchReader(data_761[0], "eval", 8, image_size=SIZE, backend="dali", cache=True)
    with pytest.raises(ValueError, match="prefetch_to_device"):
        TorchReader(data_761[0], "eval", 8, image_size=SIZE, backend="tf", prefetch_to_device=True)
    # the tf backend honours the rest
    r = TorchReader(data_761[0], "eval", 8, image_size=SIZE, backend="tf", cache=True, prefetch=2)
    assert len(list(r)) == len(r) == 96


DATALOADER_RECIPE = r"""
import json, sys, torch  # not TensorFlow: a forked tf worker imports and starts it itself
from reader.torch import TorchReader


def case(data_dir, backend, parent_first, workers, context):
    r = TorchReader(data_dir, "train", 32, image_size=(16, 16), seed=0, backend=backend)
    want = [b["key"] for b in r] if parent_first == "1" else None
    loader = torch.utils.data.DataLoader(
        r, batch_size=None, num_workers=int(workers),
        multiprocessing_context=None if context == "fork" else context,
    )
    try:
        got = [b["key"] for b in loader]
    except RuntimeError as e:
        return "refused: " + str(e).splitlines()[-1].split("Error: ", 1)[-1]  # any kind
    assert len(got) == len(r), (len(got), len(r))
    assert want is None or got == want
    return f"read {len(got)}"


def jax_case(recipe, data_dir):  # JAX_RECIPE, after the DataLoader cases
    import os, traceback
    os.environ["JAX_PLATFORMS"] = "cpu"
    names = {"data_dir": data_dir, "JAX_OUT": []}
    try:
        exec(compile(recipe, "jax_recipe", "exec"), names)
    except Exception:
        return "error: " + traceback.format_exc()[-3000:]
    return names["JAX_OUT"][0]


if __name__ == "__main__":  # the cases in order, in one training script; then JAX's
    data_dir, cases, jax_recipe, eval_dir = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
    out = {}
    for args in cases:
        out[" ".join(args)] = case(data_dir, *args)
        print(json.dumps(out), flush=True)
    out["jax"] = jax_case(jax_recipe, eval_dir)
    print(json.dumps(out), flush=True)
"""

# Run in this order by one script (one start of torch, and of TensorFlow in it): the
# training process starts DALI, then TensorFlow (in the spawn case) before the last
# case, where a fork after it is refused; the first case forks before either started
# (TensorFlow imported, its runtime not started).
DATALOADER_CASES = [
    ("tf", "0", "1", "fork", "read"),
    ("dali", "0", "1", "fork", "read"),
    ("dali", "1", "1", "fork", "read"),
    ("dali", "1", "2", "fork", "read"),  # each worker every other batch (issue 29.4)
    ("tf", "1", "1", "spawn", "read"),
    ("tf", "1", "1", "fork", "refused: TorchReader(backend='tf') in a DataLoader worker"),
]


# Run by the DataLoader cases' script after them, in its interpreter, TensorFlow
# started, JAX not yet imported (jax_case: data_dir given; what it found, in JAX_OUT).
JAX_RECIPE = r"""
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import reader

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))  # batch rows split across devices
ds = reader.make_dataset(data_dir, "eval", 32, image_size=(16, 16), shuffle=False,
                         pad_final_batch=True)
seen, total = [], 0
for batch in ds.as_numpy_iterator():
    images = jax.device_put(batch["image"], sharding)
    mask = jax.device_put(batch["mask"], sharding)
    assert len(images.sharding.device_set) == 2
    total += int(jax.numpy.sum(mask))   # a stand-in for a masked metric
    seen += [k for k, m in zip(batch["key"], batch["mask"]) if m]
JAX_OUT.append(f"{total} {len(seen)} {len(set(seen))}")
"""


@pytest.fixture(scope="module")
def dataloader_outcomes(data_761, tmp_path_factory) -> dict:
    """The DataLoader cases' outcomes, and under "jax" the JAX recipe's (one script)."""
    script = tmp_path_factory.mktemp("loader") / "loader.py"
    script.write_text(DATALOADER_RECIPE)
    cases = json.dumps([c[:-1] for c in DATALOADER_CASES])
    args = (data_761[1], cases, JAX_RECIPE, data_761[0])
    return script_outcomes(script, *args, timeout=600)  # a hang: "hung: "


@pytest.mark.parametrize("backend, parent_first, workers, context, outcome", DATALOADER_CASES)
def test_dataloader_workers_read_or_refuse_never_hang(
    dataloader_outcomes, backend, parent_first, workers, context, outcome
):
    """The pipeline is built in the process that iterates; what cannot work is refused."""
    got = dataloader_outcomes.get(" ".join([backend, parent_first, workers, context]))
    assert got is not None and got.startswith(outcome), dataloader_outcomes
    assert dataloader_outcomes["rc"].startswith("0: "), dataloader_outcomes["rc"]


def test_jax_recipe_shards_batches_across_devices_exactly_once(dataloader_outcomes):
    """JAX_RECIPE (2 CPU devices, JAX's first import in the process), run by the
    DataLoader cases' script after them: one start of the interpreter and TensorFlow."""
    assert dataloader_outcomes.get("jax") == "761 761 761", dataloader_outcomes
