"""The Python route (issue 29): NumpyReader decodes each record once in worker processes,
runs a user's transform with an rng of (seed, key, epoch, view), and keeps the read's
order and its guarantees: the same bytes for any number of processes and after a resume;
errors and a killed process are one line, never a hang."""

from __future__ import annotations

import os

import numpy as np
import pytest
from dataset_writer import write_dataset
from preprocess_transforms import (
    augment,
    dies_on_one,
    fails_on_one,
    plain,
    ragged,
    ragged_object,
    tag_one,
    tag_two,
    unsendable,
)

import reader
from evenshard import synthetic
from reader.routes.preprocess import TransformError, example_rng

B = 8
OPTS = dict(image_size=(12, 12), seed=4, epochs=2, shuffle_buffer=16, cycle_length=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """60 images (PNG and JPEG) in 4 train shards."""
    root = tmp_path_factory.mktemp("pre") / "images"
    synthetic.make_image_folder(str(root), num_labels=3, per_label=20, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("pre_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=4")
    return out


def batches(data, processes, **kw):
    return list(
        reader.NumpyReader(
            data, "train", B, transform=augment, num_processes=processes, **{**OPTS, **kw}
        )
    )


@pytest.fixture(scope="module")
def uninterrupted(data):
    """The read with 2 processes, made once for the tests that compare with it."""
    return batches(data, 2)


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x["key"] == y["key"]
        and np.array_equal(x["image"], y["image"])
        and np.array_equal(x["flip"], y["flip"])
        for x, y in zip(a, b)
    )


@pytest.mark.filterwarnings("ignore:num_processes=3 starts")  # 3 on 2 cores: on purpose
def test_the_output_is_byte_identical_for_any_number_of_processes(data, uninterrupted):
    two = uninterrupted
    assert len(two) == -(-60 // B) * 2 - 1  # 2 epochs of 60, batches across the boundary
    assert two[0]["image"].shape == (B, 12, 12, 3) and two[0]["image"].dtype == np.uint8
    assert two[0]["meta"] == [{"k": 1}] * B  # other values come as lists
    for k in (0, 1, 3):
        assert same(batches(data, k), two), k


def test_the_read_order_is_make_datasets_and_the_rng_is_the_examples(data, uninterrupted):
    got = uninterrupted  # 2 processes
    want = reader.make_dataset(data, "train", B, decode=False, **OPTS)
    assert [k for b in got for k in b["key"]] == [
        k.decode() for b in want for k in b["key"].numpy()
    ]
    first = got[0]
    rng = example_rng(OPTS["seed"], first["key"][0], int(first["epoch"][0]), 0)
    assert first["flip"][0] == rng.random()  # the transform's first draw
    # a new epoch draws anew: the same key's flips differ between epochs for some keys
    flips = {}
    for b in got:
        for k, e, f in zip(b["key"], b["epoch"], b["flip"]):
            flips.setdefault(k, {})[int(e)] = f
    assert any(v[0] != v[1] for v in flips.values())


@pytest.mark.parametrize("step", [3, 7, 8])  # mid-epoch, the batch across the epoch boundary
def test_a_resumed_read_transforms_as_the_uninterrupted_one(data, uninterrupted, step):
    batches_whole = uninterrupted  # NumpyReader, num_processes=2, OPTS
    saved = reader.NumpyReader(data, "train", B, transform=augment, num_processes=2, **OPTS)
    it = iter(saved)
    for _ in range(step):
        next(it)
    state = saved.state_dict()
    it.close()
    resumed = reader.NumpyReader(data, "train", B, transform=augment, num_processes=1, **OPTS)
    resumed.load_state_dict(state)
    assert same(list(resumed), batches_whole[step:])


def test_an_elastic_resume_transforms_each_example_as_before(data):
    """Saved by 3 workers, resumed by 2: each (key, epoch) gets the same bytes."""

    def by_key(bs):
        return {
            (k, int(e)): im.tobytes()
            for b in bs
            for k, e, im in zip(b["key"], b["epoch"], b["image"])
        }

    whole = {}
    for w in range(3):
        whole.update(by_key(batches(data, 1, num_workers=3, worker_index=w)))
    state = reader.ReadState(seed=OPTS["seed"], batch_size=B, step=2, num_workers=3)
    for j in range(2):
        r = reader.NumpyReader(
            data,
            "train",
            B,
            transform=augment,
            num_processes=1,
            state=state,
            num_workers=2,
            worker_index=j,
            **{k: v for k, v in OPTS.items() if k != "seed"},
        )
        for key, image in by_key(r).items():
            assert whole[key] == image, key


def test_views_come_from_one_decode_and_share_a_batch(data):
    r = reader.NumpyReader(data, "train", B, transform=augment, views=2, num_processes=2, **OPTS)
    got = list(r)
    assert r.decoded == 60 * 2  # once a record an epoch, whatever the views
    for b in got:
        assert list(b["view"]) == [0, 1] * (B // 2)
        assert b["key"][0::2] == b["key"][1::2]
        assert not np.array_equal(b["image"][0], b["image"][1])  # two draws
    assert sum(int(b["mask"].sum()) for b in got) == 60 * 2 * 2
    with pytest.raises(ValueError, match="multiple of views=3"):
        reader.NumpyReader(data, "train", B, views=3, **OPTS)


def test_a_failing_transform_is_one_line_naming_the_key_and_the_function(data):
    r = reader.NumpyReader(data, "train", B, transform=fails_on_one, num_processes=2, **OPTS)
    with pytest.raises(RuntimeError) as raised:
        list(r)
    message = str(raised.value)
    assert "\n" not in message and "fails_on_one" in message and "img_00003.png" in message
    assert "ValueError: no good second line" in message


def test_on_error_skip_does_not_skip_a_transform_that_raises(data, tmp_path):
    """on_error="skip" is for records that cannot be read: a transform's own error still
    stops the read, in the same line, and nothing is written to the ledger."""
    ledger = tmp_path / "skipped.jsonl"
    r = reader.NumpyReader(
        data,
        "train",
        B,
        transform=fails_on_one,
        num_processes=2,
        on_error="skip",
        error_ledger=str(ledger),
        **OPTS,
    )
    with pytest.raises(RuntimeError, match="fails_on_one.*img_00003.png"):
        list(r)
    assert not ledger.exists() or ledger.read_text() == ""


def test_a_killed_process_is_one_line_never_a_hang(data):
    r = reader.NumpyReader(data, "train", B, transform=dies_on_one, num_processes=2, **OPTS)
    with pytest.raises(RuntimeError, match="a preprocessing process died while batch"):
        list(r)


def test_a_transform_that_cannot_be_sent_is_refused_when_the_reader_is_built(data):
    with pytest.raises(TypeError, match="cannot be sent to worker processes"):
        reader.NumpyReader(data, "train", B, transform=lambda ex, rng: ex, **OPTS)
    # in this process (num_processes=0) a lambda is fine: nothing is sent
    here = reader.NumpyReader(
        data, "train", B, transform=lambda ex, rng: ex, num_processes=0, **OPTS
    )
    assert len(list(here)) == len(here)


def test_ragged_arrays_come_as_lists_and_arrays_of_objects_are_still_checked(data):
    """Arrays of numbers are sent unchecked (their pickling would copy every byte: a
    native-size image's); an array holding objects is still tried, and refused."""
    batches = list(reader.NumpyReader(data, "train", B, transform=ragged, num_processes=0, **OPTS))
    rows = [r for b in batches for r in b["ragged"]]
    assert len(rows) == sum(len(b["key"]) for b in batches)
    assert {r.shape[0] for r in rows} > {1} and all((r == 7).all() for r in rows)
    with pytest.raises(TransformError, match="output cannot be sent back"):
        list(reader.NumpyReader(data, "train", B, transform=ragged_object, num_processes=0, **OPTS))


@pytest.mark.parametrize("processes", [0, 2])
def test_two_reads_side_by_side_keep_their_own_transforms_and_blocks(data, processes):
    before = _own_blocks()
    kw = dict(num_processes=processes, **OPTS)
    one = iter(reader.NumpyReader(data, "train", B, transform=tag_one, **kw))
    two = iter(reader.NumpyReader(data, "train", B, transform=tag_two, **kw))
    for a in one:  # the two reads' batches in turn
        assert set(a["tag"].tolist()) == {1} and set(next(two)["tag"].tolist()) == {2}
    assert next(two, None) is None
    with pytest.raises(TransformError, match="output cannot be sent back"):
        list(reader.NumpyReader(data, "train", B, transform=unsendable, **kw))
    assert _own_blocks() - before == set()


def _own_blocks() -> set[str]:
    """This process's readers' shared memory blocks (another process's are not ours to
    count: a busy machine has them come and go)."""
    from reader.cache.folder import this_owner

    return {n for n in os.listdir("/dev/shm") if n.startswith(f"evenshard-{this_owner()}-")}


def test_a_read_left_early_leaves_no_shared_memory_behind(data):
    before = _own_blocks()
    r = reader.NumpyReader(data, "train", B, transform=augment, num_processes=2, **OPTS)
    it = iter(r)
    next(it)
    it.close()  # as a for loop left by break does, when the generator goes
    assert _own_blocks() - before == set()


def test_views_spread_batches_apart_one_decode_each_and_exactly_once(data):
    """Issue 29.3: view_spread=D puts one view of B images in each batch and the views
    of an image at least D batches apart; every (key, view) once an epoch; one decode an
    image; K=0 and K=2 give the same bytes."""
    views, spread = 3, 2
    train = reader.NumpyReader(
        data,
        "train",
        B,
        transform=augment,
        num_processes=0,
        views=views,
        view_spread=spread,
        **{**OPTS, "epochs": 1},
    )
    got = list(train)
    assert len(got) == len(train) == views * -(-60 // B)
    assert train.decoded == 60
    seen = {}
    for number, batch in enumerate(got):
        assert len(set(batch["view"].tolist())) == 1  # one view a batch
        assert len(set(batch["key"])) == len(batch["key"])  # of different images
        for key, view in zip(batch["key"], batch["view"].tolist()):
            assert (key, view) not in seen
            seen[(key, view)] = number
    assert len(seen) == 60 * views
    gaps = [seen[(k, v + 1)] - seen[(k, v)] for (k, v) in seen if v + 1 < views]
    assert min(gaps) >= spread
    two = list(
        reader.NumpyReader(
            data,
            "train",
            B,
            transform=augment,
            num_processes=2,
            views=views,
            view_spread=spread,
            **{**OPTS, "epochs": 1},
        )
    )
    for a, b in zip(got, two):
        assert a["key"] == b["key"] and (a["image"] == b["image"]).all()


def test_make_dataset_spreads_views_as_numpy_reader_does(data):
    """view_spread=D on make_dataset: NumpyReader's batches, the same keys, views and
    pixels in the same batches (mirrored crops too), an image's views D batches apart;
    a ReadState cannot say where a read stands between an image's views: resuming one
    is refused in one line."""
    spread = 2
    kw = dict(
        transform=plain,
        num_processes=0,
        views=4,
        view_spread=spread,
        mirror_views=True,
        random_crop=True,
        **{**OPTS, "epochs": 1},
    )
    want = list(reader.NumpyReader(data, "train", B, **kw))
    ds = reader.make_dataset(data, "train", B, **kw)
    got = list(ds.as_numpy_iterator())
    assert len(got) == len(want) == ds.cardinality().numpy() == 4 * -(-60 // B)
    seen = {}
    for number, (a, b) in enumerate(zip(got, want)):
        assert [k.decode() for k in a["key"]] == b["key"]
        assert (a["view"] == b["view"]).all() and (a["image"] == b["image"]).all()
        assert (a["draw"] == b["draw"]).all()
        seen.update({(k, v): number for k, v in zip(b["key"], b["view"].tolist())})
    assert len(seen) == 60 * 4
    assert min(seen[(k, v + 1)] - seen[(k, v)] for (k, v) in seen if v < 3) >= spread
    again = list(ds.as_numpy_iterator())  # a new pass of the read (Keras' next epoch)
    assert [list(b["key"]) for b in again] == [list(b["key"]) for b in got]
    state = reader.ReadState(seed=OPTS["seed"], batch_size=B)
    with pytest.raises(ValueError, match="view_spread.*NumpyReader's state_dict"):
        reader.resume(data, "train", state, **kw)


def test_views_spread_resume_mid_group_yields_the_uninterrupted_views(data):
    """A state saved at any batch, between an image's views too, resumes to exactly the
    rest of the uninterrupted read (2 epochs, across the epoch boundary)."""
    kw = dict(transform=augment, num_processes=0, views=2, view_spread=3, **OPTS)
    whole = list(reader.NumpyReader(data, "train", B, **kw))
    for stop in (1, 4, 7, len(whole) // 2 + 1, len(whole) - 1):
        first = reader.NumpyReader(data, "train", B, **kw)
        it = iter(first)
        for _ in range(stop):
            next(it)
        saved = first.state_dict()
        again = reader.NumpyReader(data, "train", B, **kw)
        again.load_state_dict(saved)
        rest = list(again)
        assert len(rest) == len(again) == len(whole) - stop, stop
        for a, b in zip(whole[stop:], rest):
            assert a["key"] == b["key"] and (a["view"] == b["view"]).all()
            assert (a["image"] == b["image"]).all()
    with pytest.raises(ValueError, match="view_spread must be"):
        reader.NumpyReader(data, "train", B, views=2, view_spread=0, num_processes=0)
    with pytest.raises(ValueError, match="view_spread=20 needs at least 20 batches .* has 15"):
        reader.NumpyReader(data, "train", B, views=2, view_spread=20, num_processes=0, **OPTS)
    with pytest.raises(ValueError, match="same views and view_spread"):
        plain = reader.NumpyReader(data, "train", B, num_processes=0, **OPTS)
        plain.load_state_dict({**plain.state_dict(), "view_skip": 3})


SPREAD = dict(transform=augment, num_processes=0, views=3, view_spread=2, **{**OPTS, "epochs": 1})


def spread_read(data, workers, index, state=None):
    r = reader.NumpyReader(data, "train", 4, num_workers=workers, worker_index=index, **SPREAD)
    if state is not None:
        r.load_state_dict(state)
    return r


def sent_views(batches, first_step, sent, pixels):
    """Records each real (key, view) of ``batches`` at its step (batch number of the
    whole run), once, and its pixels."""
    for step, batch in enumerate(batches, start=first_step):
        assert len(set(batch["view"].tolist())) == 1
        for key, view, real, image in zip(
            batch["key"], batch["view"], batch["mask"], batch["image"]
        ):
            if real:
                assert (key, int(view)) not in sent, (key, view)
                sent[(key, int(view))] = step
                pixels[(key, int(view))] = image.tobytes()


def check_every_view_once_and_apart(sent, pixels, whole):
    assert set(sent) == set(whole)  # 60 images x 3 views, each once
    assert pixels == whole  # each view's bytes as the uninterrupted read's
    gaps = [sent[(k, v + 1)] - sent[(k, v)] for k, v in sent if v < 2]
    assert min(gaps) >= SPREAD["view_spread"]


# (3, 2, 8): the old workers read 30, 15 and 15 images; (2, 3, 16): a new worker's first
# batch is padding (its own read is empty)
@pytest.mark.parametrize(
    "old,new,stop", [(3, 2, 4), (2, 3, 3), (1, 2, 2), (2, 1, 5), (3, 2, 8), (2, 3, 16)]
)
def test_views_spread_elastic_resume_mid_group_sends_every_view_once(data, old, new, stop):
    """Issue 29.3: a state saved between the views of its images by ``old`` workers,
    resumed by ``new``: every (key, view) of the epoch once, with the uninterrupted
    read's bytes, two views of an image still >= view_spread batches apart (in the
    whole run's batch numbers), every new worker the same number of batches."""
    whole, sent, pixels, states = {}, {}, {}, []
    for w in range(old):
        every = {}
        sent_views(list(spread_read(data, old, w)), 0, {}, every)
        whole.update(every)
        first = spread_read(data, old, w)
        it = iter(first)
        sent_views([next(it) for _ in range(stop)], 0, sent, pixels)
        states.append(first.state_dict())
        it.close()
    state = states[-1]
    assert all(other == state for other in states)  # one state, whatever a worker's count
    assert state["view_skip"] > 0  # between the views of its images
    lengths = []
    for m in range(new):
        resumed = spread_read(data, new, m, state)
        got = list(resumed)
        assert len(got) == len(resumed)
        lengths.append(len(got))
        sent_views(got, stop, sent, pixels)
    assert len(set(lengths)) == 1
    check_every_view_once_and_apart(sent, pixels, whole)


def test_views_spread_state_saved_during_a_handover(data):
    """Saved while the handed-over views are sent: the same worker count resumes to
    exactly the rest, another is refused in one line; saved after them, any count
    resumes, and the whole run still sends every (key, view) once."""
    whole, sent, pixels, states = {}, {}, {}, []
    for w in range(3):
        sent_views(list(spread_read(data, 3, w)), 0, {}, whole)
        it = iter(first := spread_read(data, 3, w))
        sent_views([next(it) for _ in range(4)], 0, sent, pixels)
        it.close()
        states.append(first.state_dict())
    state = states[0]
    during, after, sent_first = [], [], []
    for m in range(2):
        r = spread_read(data, 2, m, state)
        it = iter(r)
        got = [next(it) for _ in range(3)]
        during.append(r.state_dict())
        while "view_handover" in r.state_dict():  # to the end of the handover
            got.append(next(it))
        after.append(r.state_dict())
        sent_first.append(got)
        it.close()
        rest = list(spread_read(data, 2, m, during[m]))
        assert same(list(spread_read(data, 2, m, state))[3:], rest)
    assert "view_handover" in during[0]
    assert during[0] == during[1] and after[0] == after[1]  # one state for every worker
    with pytest.raises(ValueError, match="saved by 2 workers 3 batches into .* resume it with 2"):
        spread_read(data, 3, 0, during[0])
    for bad in ([2, True], [0, 3], [2, -1], [2, 10**6], None):
        with pytest.raises(ValueError, match="view_handover"):
            spread_read(data, 2, 0, {**during[0], "view_handover": bad})
    with pytest.raises(ValueError, match="view_handover .* with view_skip 0"):
        spread_read(data, 2, 0, {**during[0], "view_skip": 0})
    assert len(sent_first[0]) == len(sent_first[1])
    for got in sent_first:  # the two workers' batches of the handover, then 3 workers on
        sent_views(got, 4, sent, pixels)
    for w in range(3):
        sent_views(list(spread_read(data, 3, w, after[0])), 4 + len(got), sent, pixels)
    check_every_view_once_and_apart(sent, pixels, whole)


def test_make_dataset_with_a_transform_is_the_numpy_readers_batches_and_trains(data):
    """Issue 29.1: transform= on make_dataset: NumpyReader's batches as a tf.data dataset,
    again on each pass; a Keras model fits on it; a state resumes it."""
    import tensorflow as tf

    kw = dict(transform=plain, num_processes=2, **{**OPTS, "epochs": 1})
    ds = reader.make_dataset(data, "train", B, **kw)
    want = list(reader.NumpyReader(data, "train", B, **kw))
    for _ in range(2):  # a second pass is a new pass of the reader, the same batches
        got = list(ds.as_numpy_iterator())
        assert len(got) == len(want) == ds.cardinality().numpy()
        for a, b in zip(got, want):
            assert (a["image"] == b["image"]).all() and (a["draw"] == b["draw"]).all()
    model = tf.keras.Sequential(
        [tf.keras.Input((12, 12, 3)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)]
    )
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds.map(lambda b: (b["image"], b["label"])), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    state = reader.ReadState.from_json(
        reader.NumpyReader(data, "train", B, **kw).state_dict()["read_state"]
    ).advance(3)
    resumed, start = reader.make_dataset(data, "train", B, state=state, **kw)
    assert start == state
    for a, b in zip(resumed.as_numpy_iterator(), want[3:]):
        assert (a["image"] == b["image"]).all()
    with pytest.raises(TypeError, match="'meta' holds dict values"):
        reader.make_dataset(data, "train", B, transform=augment, num_processes=0, **OPTS)


def test_torch_reader_with_a_transform_any_dataloader_workers(data):
    """Issue 29.1: TorchReader(transform=) gives NumpyReader's batches as tensors, alike
    in DataLoader(num_workers=0 and 2) (each worker runs the transform on its batches),
    and a state saved under the DataLoader resumes to the rest of the read."""
    import torch

    from reader.torch import TorchReader

    kw = dict(transform=augment, num_processes=0, **{**OPTS, "epochs": 1})
    want = list(reader.NumpyReader(data, "train", B, **kw))
    direct = list(TorchReader(data, "train", B, **kw))
    assert [b["key"] for b in direct] == [b["key"] for b in want]
    assert all((a["image"].numpy() == b["image"]).all() for a, b in zip(direct, want))
    assert direct[0]["meta"] == want[0]["meta"]  # other values stay lists
    tr = TorchReader(data, "train", B, **kw)
    loader = torch.utils.data.DataLoader(
        tr, batch_size=None, num_workers=2, multiprocessing_context="forkserver"
    )
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 3:
            saved = tr.state_dict()
            break
    rest = TorchReader(data, "train", B, **kw)
    rest.load_state_dict(saved)
    got += list(rest)
    assert [b["key"] for b in got] == [b["key"] for b in want]
    assert all((a["image"].numpy() == b["image"]).all() for a, b in zip(got, want))
    with pytest.raises(ValueError, match='Python route: backend="python"'):
        TorchReader(data, "train", B, backend="tf", **kw)


def test_the_python_routes_jpeg_decoder_gives_pillows_pixels():
    import io

    from PIL import Image

    from evenshard.synthetic import photo_bytes
    from reader.decode.pixels import decode as _decode

    photo = Image.open(io.BytesIO(photo_bytes(np.random.default_rng(2), 75, 98)))
    kinds = {
        "4:2:0": dict(subsampling=2),
        "4:4:4": dict(subsampling=0),
        "progressive": dict(progressive=True),
        "gray": dict(),
    }
    for name, kw in kinds.items():
        out = io.BytesIO()
        (photo.convert("L") if name == "gray" else photo).save(out, "JPEG", quality=85, **kw)
        for channels, mode in ((3, "RGB"), (4, "RGBA")):
            want = np.asarray(Image.open(io.BytesIO(out.getvalue())).convert(mode))
            assert (_decode(out.getvalue(), channels) == want).all(), (name, channels)


def test_more_processes_than_cores_is_said_once_as_dataloader_says_it(data, monkeypatch):
    """num_processes above the cores this process may run on warns (PyTorch's DataLoader
    warns of more workers than its suggested maximum); the cores or fewer, and None, do
    not."""
    import warnings

    from reader.routes import python_route

    monkeypatch.setattr(python_route, "default_processes", lambda: 2)
    with pytest.warns(UserWarning, match=r"num_processes=5 starts 5 worker processes on 2 cores"):
        reader.NumpyReader(data, "train", 4, num_processes=5, **OPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (None, 0, 2):
            reader.NumpyReader(data, "train", 4, num_processes=n, **OPTS)
