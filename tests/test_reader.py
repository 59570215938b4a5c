"""reader.make_dataset over datasets converted in the test."""

from __future__ import annotations

import collections
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import load_info, write_manifest
from dataset_writer import write_dataset
from preprocess_transforms import flip

import reader
from evenshard import synthetic


@pytest.fixture(scope="module")
def images_761(tmp_path_factory):
    root = tmp_path_factory.mktemp("r761") / "images"
    synthetic.make_image_folder(
        str(root), num_labels=4, per_label=190, formats=("jpeg", "png", "gif", "bmp", "webp")
    )
    (root / "label_0" / "extra.png").write_bytes(
        synthetic.image_bytes("png", 20, 20, np.random.default_rng(1))
    )
    return str(root)


@pytest.fixture(scope="module")
def eval_761(images_761, tmp_path_factory):
    """761 examples (prime) in one split "eval" of 3 shards."""
    out = str(tmp_path_factory.mktemp("eval761"))
    write_dataset(images_761, out, "--splits=eval=1.0", "--num_shards=3")
    return out


@pytest.fixture(scope="module")
def train_760(images_761, tmp_path_factory):
    """760 examples in split "train" of 8 equal shards; path kind too."""
    base = tmp_path_factory.mktemp("train760")
    rows = [
        {"path": f"images/label_{k}/{name}", "label": f"label_{k}"}
        for k in range(4)
        for name in sorted(os.listdir(f"{images_761}/label_{k}"))
        if name != "extra.png"
    ]
    manifest = write_manifest(
        os.path.join(os.path.dirname(images_761), "m760.csv"), rows, ["path", "label"]
    )
    write_dataset(manifest, str(base / "image"), "--splits=train=1.0", "--num_shards=8")
    write_dataset(
        manifest, str(base / "path"), "--splits=train=1.0", "--num_shards=8", "--record_kind=path"
    )
    return str(base / "image"), str(base / "path")


def keys(ds) -> list[str]:
    out = []
    for ex in ds:
        k = ex["key"].numpy()
        out += [x.decode() for x in np.atleast_1d(k)]
    return out


def written_keys(data_dir: str, split: str) -> collections.Counter:
    import tensorflow as tf

    info = load_info(data_dir)
    c = collections.Counter()
    for shard in info["splits"][split]["shards"]:
        for raw in tf.data.TFRecordDataset(os.path.join(data_dir, shard["file"])):
            ex = tf.train.Example.FromString(raw.numpy())
            c[ex.features.feature["image/key"].bytes_list.value[0].decode()] += 1
    return c


@pytest.mark.parametrize("kind", ["image", "path"])
def test_reads_the_multiset_written(train_760, kind):
    data_dir = train_760[0 if kind == "image" else 1]
    ds = reader.make_dataset(data_dir, "train", batch_size=64, image_size=(16, 16), seed=0)
    assert collections.Counter(keys(ds)) == written_keys(data_dir, "train")
    assert sum(written_keys(data_dir, "train").values()) == 760


def test_seeded_runs_repeat_and_seeds_and_epochs_differ(train_760):
    def order(seed, epochs=1):
        return keys(
            reader.make_dataset(
                train_760[0], "train", batch_size=None, decode=False, seed=seed, epochs=epochs
            )
        )

    assert order(1) == order(1)
    assert order(1) != order(2)
    two = order(1, epochs=2)
    assert len(two) == 1520
    assert two[:760] != two[760:]
    assert collections.Counter(two[:760]) == collections.Counter(two[760:])


def test_exact_once_evaluation_of_a_prime_split(eval_761):
    ds = reader.make_dataset(eval_761, "eval", batch_size=32, shuffle=False, decode=False)
    batches = [b["key"].numpy() for b in ds]
    assert len(batches) == 24 == ds.cardinality().numpy()
    assert len(batches[-1]) == 25
    assert collections.Counter(k.decode() for b in batches for k in b) == written_keys(
        eval_761, "eval"
    )

    padded = reader.make_dataset(
        eval_761, "eval", batch_size=32, shuffle=False, image_size=(8, 8), pad_final_batch=True
    )
    last = list(padded)[-1]
    assert last["image"].shape == (32, 8, 8, 3)
    assert last["mask"].numpy().sum() == 25


def test_exact_once_evaluation_across_two_workers_with_padding(eval_761):
    seen, batch_counts = [], []
    for w in range(2):
        ds = reader.make_dataset(
            eval_761,
            "eval",
            batch_size=32,
            shuffle=False,
            decode=False,
            pad_final_batch=True,
            num_workers=2,
            worker_index=w,
        )
        batches = list(ds)
        batch_counts.append(len(batches))
        assert ds.cardinality().numpy() == len(batches)
        for b in batches:
            assert b["key"].shape == (32,)
            seen += [k.decode() for k, m in zip(b["key"].numpy(), b["mask"].numpy()) if m]
    assert batch_counts[0] == batch_counts[1]
    assert len(seen) == 761 and set(seen) == set(written_keys(eval_761, "eval"))


@pytest.mark.parametrize("workers", [2, 4])
def test_training_workers_read_disjoint_equal_parts(train_760, workers):
    parts = []
    for w in range(workers):
        ctx = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=w)
        parts.append(
            keys(
                reader.make_dataset(
                    train_760[0], "train", batch_size=None, decode=False, seed=5, input_context=ctx
                )
            )
        )
    assert len({len(p) for p in parts}) == 1
    union = [k for p in parts for k in p]
    assert len(union) == len(set(union)) == 760


def test_path_root_remap_after_moving_the_images(train_760, images_761, tmp_path):
    info = load_info(train_760[1])
    moved = tmp_path / "moved"
    shutil.copytree(info["path_root"], moved)
    ds = reader.make_dataset(
        train_760[1],
        "train",
        batch_size=None,
        image_size=(8, 8),
        path_root=str(moved),
        shuffle=False,
    )
    first = next(iter(ds))
    assert first["image"].shape == (8, 8, 3)
    assert first["path"].numpy().decode().startswith("images/label_")
    with pytest.raises(reader.DatasetError, match="the path_root you gave.*pass path_root="):
        reader.make_dataset(train_760[1], "train", decode=False, path_root=str(tmp_path / "x"))
    # the images moved and no path_root is given: the error names the file and the fix
    recorded = tmp_path / "recorded"
    shutil.copytree(train_760[1], recorded)
    with open(recorded / "dataset_info.json") as f:
        text = f.read().replace(info["path_root"], str(tmp_path / "gone"))
    with open(recorded / "dataset_info.json", "w") as f:
        f.write(text)
    with pytest.raises(reader.DatasetError) as e:
        reader.make_dataset(str(recorded), "train", decode=False)
    message = str(e.value)
    assert str(tmp_path / "gone" / "images" / "label_") in message
    assert "recorded at conversion" in message and "pass path_root=" in message


def test_damaged_datasets_raise_errors_naming_the_problem(eval_761, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(eval_761, bad)
    info = load_info(str(bad))
    shard = str(bad / info["splits"]["eval"]["shards"][1]["file"])

    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    ds = reader.make_dataset(str(bad), "eval", batch_size=None, decode=False, shuffle=False)
    with pytest.raises(reader.DatasetError, match=f"^{shard} is corrupt"):
        list(ds)

    os.remove(shard)
    with pytest.raises(reader.DatasetError, match=f"shard {shard} .* missing"):
        reader.make_dataset(str(bad), "eval")

    open(shard, "wb").write(bytes(data[: len(data) // 3]))
    with pytest.raises(reader.DatasetError, match="truncated"):
        reader.make_dataset(str(bad), "eval")

    os.remove(bad / "dataset_info.json")
    with pytest.raises(reader.DatasetError, match="dataset_info.json not found.*did not finish"):
        reader.make_dataset(str(bad), "eval")


def test_shapes_and_dtypes(train_760):
    d = train_760[0]
    ds = reader.make_dataset(d, "train", batch_size=4, image_size=(10, 12), seed=0)
    b = next(iter(ds))
    assert b["image"].shape == (4, 10, 12, 3) and b["image"].dtype == tf.uint8
    assert b["label"].dtype == tf.int64 and b["key"].dtype == tf.string

    ds = reader.make_dataset(
        d, "train", batch_size=4, image_size=(10, 12), seed=0, as_supervised=True, channels=1
    )
    image, label = next(iter(ds))
    assert image.shape == (4, 10, 12, 1) and label.shape == (4,)

    raw = next(iter(reader.make_dataset(d, "train", batch_size=4, decode=False, seed=0)))
    assert raw["image"].dtype == tf.string and raw["image"].shape == (4,)
    decoded = tf.io.decode_image(raw["image"][0], expand_animations=False)
    assert decoded.shape.rank == 3

    ds = reader.make_dataset(d, "train", batch_size=8, image_size=(6, 6), random_crop=True, seed=3)
    assert next(iter(ds))["image"].shape == (8, 6, 6, 3)
    single = next(iter(reader.make_dataset(d, "train", batch_size=None, seed=0)))
    assert single["image"].shape.rank == 3 and single["image"].shape[-1] == 3


def test_no_autotuning_thread_to_wait_for_when_an_iterator_is_deleted(train_760):
    """tf.data's autotuning model thread made deleting an iterator (a loop's end) wait
    for its next wake-up: 0 to 10 s at the end of a read of 20,000 photos
    (benchmarks/HISTORY.md). Every dataset the reader gives runs without it."""
    d = train_760[0]
    for ds in (
        reader.make_dataset(d, "train", 4, image_size=(8, 8), seed=0),
        reader.make_dataset(d, "train", None, seed=0, shuffle=False),
        reader.make_dataset(d, "train", 4, image_size=(8, 8), seed=0, transform=flip),
    ):
        assert ds.options().autotune.enabled is False
    seeded = reader.make_dataset(d, "train", 4, image_size=(8, 8), seed=0)
    assert seeded.options().deterministic is True


def test_misuse_is_refused(train_760):
    with pytest.raises(ValueError, match="image_size"):
        reader.make_dataset(train_760[0], "train", batch_size=4)
    with pytest.raises(ValueError, match="shuffle=False, epochs=1"):
        reader.make_dataset(train_760[0], "train", batch_size=4, decode=False, pad_final_batch=True)
    with pytest.raises(reader.DatasetError, match="split 'val' not in"):
        reader.make_dataset(train_760[0], "val")


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_every_format_decodes_to_any_channel_count(train_760, channels):
    ds = reader.make_dataset(
        train_760[0], "train", batch_size=None, shuffle=False, channels=channels
    )
    formats = collections.Counter()
    for ex in ds:
        assert ex["image"].shape[-1] == channels
        formats[ex["key"].numpy().decode().rsplit(".", 1)[1]] += 1
    assert set(formats) == {"jpg", "png", "gif", "bmp", "webp"}


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_cardinality_over_several_epochs(eval_761, drop_remainder):
    ds = reader.make_dataset(
        eval_761,
        "eval",
        batch_size=32,
        decode=False,
        seed=1,
        epochs=3,
        shuffle=True,
        drop_remainder=drop_remainder,
    )
    batches = list(ds)  # the cardinality assertion fails here if it is wrong
    assert len(batches) == ds.cardinality().numpy() == (71 if drop_remainder else 72)
    assert sum(int(b["key"].shape[0]) for b in batches) == (2272 if drop_remainder else 2283)


def test_prefetch_to_device_yields_the_same_batches(train_760):
    # No GPU here: the CPU device runs the same prefetch_to_device code path.
    def run(**kw):
        ds = reader.make_dataset(train_760[0], "train", batch_size=64, decode=False, seed=2, **kw)
        return [b["key"].numpy().tolist() for b in ds]

    assert run(prefetch_to_device="/cpu:0") == run(prefetch_to_device=False)
    if not tf.config.list_logical_devices("GPU"):
        with pytest.raises(ValueError, match="no GPU is visible"):
            reader.make_dataset(
                train_760[0], "train", batch_size=8, decode=False, prefetch_to_device=True
            )


def test_uneven_workers_warn_with_the_fix(eval_761, caplog):
    with caplog.at_level("WARNING", logger="reader.pipeline"):
        reader.make_dataset(
            eval_761,
            "eval",
            batch_size=None,
            decode=False,
            shuffle=False,
            num_workers=2,
            worker_index=0,
        )
    assert "3 shards, not a multiple of 2 workers" in caplog.text
    assert "--shard_multiple 2" in caplog.text


def test_unshuffled_reads_keep_file_order_by_default(eval_761):
    info = load_info(eval_761)
    expected = []
    for shard in info["splits"]["eval"]["shards"]:
        for raw in tf.data.TFRecordDataset(os.path.join(eval_761, shard["file"])):
            ex = tf.train.Example.FromString(raw.numpy())
            expected.append(ex.features.feature["image/key"].bytes_list.value[0].decode())
    ds = reader.make_dataset(
        eval_761, "eval", batch_size=32, shuffle=False, decode=False, cycle_length=1
    )
    assert keys(ds) == expected


def test_keras_evaluates_padded_supervised_batches_on_real_examples_only(eval_761):
    """(image, label, sample_weight): padding weighs 0 in Keras weighted metrics."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten()]
        + [keras.layers.Dense(4)]
    )
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(
        loss=xent,
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="acc"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent"),
        ],
    )
    plain = reader.make_dataset(
        eval_761, "eval", batch_size=None, shuffle=False, image_size=(8, 8), as_supervised=True
    )
    images = np.stack([im.numpy() for im, _ in plain])
    labels = np.array([int(label) for _, label in plain])
    logits = model.predict(images, verbose=0)
    accuracy = np.mean(np.argmax(logits, 1) == labels)
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, True)))

    def padded(**workers):
        return reader.make_dataset(
            eval_761,
            "eval",
            batch_size=32,
            shuffle=False,
            image_size=(8, 8),
            pad_final_batch=True,
            as_supervised=True,
            **workers,
        )

    one = padded()
    assert len(one.element_spec) == 3 and one.element_spec[2].dtype.name == "float32"
    two = padded(num_workers=2, worker_index=0).concatenate(padded(num_workers=2, worker_index=1))
    assert sum(int(w.numpy().sum()) for _, _, w in two) == 761
    for ds in (one, two):
        got = model.evaluate(ds, verbose=0, return_dict=True)
        assert got["acc"] == pytest.approx(accuracy, abs=1e-6)  # 118/191, not 119/192
        assert got["xent"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"seed": 0},
        {"seed": 0, "shuffle_buffer": 0},
        {"seed": 0, "cache": True},
        {"seed": 0, "random_crop": True},
        {"shuffle": False},
        {"seed": 0, "drop_remainder": True},
        {"shuffle": False, "pad_final_batch": True},
    ],
)
@pytest.mark.parametrize("supervised", [False, True])
def test_every_element_has_a_known_rank(train_760, kw, supervised):
    """Keras needs ranks: numpy_function in the order left the label's rank unknown."""
    ds = reader.make_dataset(
        train_760[0], "train", 16, image_size=(8, 8), as_supervised=supervised, **kw
    )
    fixed = kw.get("drop_remainder") or kw.get("pad_final_batch")
    for spec in tf.nest.flatten(ds.element_spec):
        assert spec.shape.rank is not None, (kw, ds.element_spec)
        assert spec.shape[0] == (16 if fixed else None), (kw, ds.element_spec)
    if not fixed:
        single = reader.make_dataset(train_760[0], "train", None, image_size=(8, 8), **kw)
        assert {k: s.shape.rank for k, s in single.element_spec.items()} == {
            "image": 3,
            "label": 0,
            "key": 0,
        }


def test_keras_fit_and_evaluate(images_761, tmp_path):
    """Keras fit on a shuffled split, then exact evaluate, as the README shows."""
    import keras

    write_dataset(images_761, str(tmp_path / "out"), "--splits=train=0.8,val=0.2")
    out = str(tmp_path / "out")
    train = reader.make_dataset(out, "train", 32, image_size=(8, 8), as_supervised=True, seed=0)
    val = reader.make_dataset(
        out, "val", 32, image_size=(8, 8), shuffle=False, pad_final_batch=True, as_supervised=True
    )
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.layers.Input((8, 8, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(5),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    history = model.fit(train, validation_data=val, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))
    result = model.evaluate(val, return_dict=True, verbose=0)
    assert 0.0 <= result["acc"] <= 1.0
    # the weighted accuracy counts the real val examples once: recompute it by hand
    right = total = 0
    for image, label, weight in val:
        pred = np.argmax(model.predict_on_batch(image), axis=1)
        right += int(((pred == label.numpy()) * weight.numpy()).sum())
        total += int(weight.numpy().sum())
    assert total == load_info(out)["splits"]["val"]["num_examples"]
    assert result["acc"] == pytest.approx(right / total, abs=1e-6)
