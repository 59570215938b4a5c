"""What a Python transform returns (issue 41): a field on some examples only stops the
read in one line, never dropped; a transform that makes its own output size needs no
``image_size`` and its output is not resized; ``mirror_views`` pairs each view's crop
with its mirror, on every reader that has views."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.routes.preprocess import TransformError

B = 8
OPTS = dict(seed=4, epochs=1, shuffle_buffer=16, cycle_length=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """48 images (PNG and JPEG, sizes around 24x32) in 2 train shards."""
    root = tmp_path_factory.mktemp("out_t") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=24, formats=("png", "jpeg"))
    out = str(tmp_path_factory.mktemp("out_t_ds") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


def _number(key: str) -> int:
    return int(re.search(r"(\d+)\.\w+$", key).group(1))


def extra_on_some(example, rng):
    """``extra`` on one example in five, absent from the others."""
    return {**example, "extra": 1} if _number(example["key"]) % 5 == 0 else example


def extra_or_none(example, rng):
    """``extra`` on every example: None where it has no value."""
    return {**example, "extra": 1 if _number(example["key"]) % 5 == 0 else None}


def extra_in_epoch(example, rng, epoch):
    """``extra`` on the examples of one epoch only."""
    return {**example, "extra": 1} if example["epoch"] == epoch else example


@pytest.mark.parametrize("processes", [0, 2])
def test_a_field_some_examples_lack_stops_the_read_naming_it(data, processes):
    r = reader.NumpyReader(
        data, "train", B, transform=extra_on_some, num_processes=processes, image_size=12, **OPTS
    )
    with pytest.raises(TransformError) as raised:
        list(r)
    message = str(raised.value)
    assert "\n" not in message and "extra_on_some" in message and "'extra'" in message
    assert len(re.findall(r"key '[^']+'", message)) == 2  # one with it, one without
    # a value on every example (None where there is none): every batch carries it
    got = list(
        reader.NumpyReader(
            data,
            "train",
            B,
            transform=extra_or_none,
            num_processes=processes,
            image_size=12,
            **OPTS,
        )
    )
    assert all("extra" in b for b in got)
    assert sum(v == 1 for b in got for v in b["extra"]) == sum(
        _number(k) % 5 == 0 for b in got for k in b["key"]
    )


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_field_some_batches_lack_stops_the_read_naming_it(data, epoch):
    """48 images, batches of 8: the epochs meet at a batch boundary, so each batch is
    alike within and the second epoch's differ from the first's."""
    transform = functools.partial(extra_in_epoch, epoch=epoch)
    r = reader.NumpyReader(
        data,
        "train",
        B,
        transform=transform,
        num_processes=0,
        image_size=12,
        **{**OPTS, "epochs": 2},
    )
    with pytest.raises(TransformError) as raised:
        list(r)
    message = str(raised.value)
    assert "\n" not in message and "'extra'" in message
    assert len(re.findall(r"key '[^']+'", message)) == 2


def centre_8(example, rng):
    """Makes its own output size: the centre 8x8 of the image given (and that one's shape)."""
    image = example["image"]
    top, left = (image.shape[0] - 8) // 2, (image.shape[1] - 8) // 2
    return {
        **example,
        "image": image[top : top + 8, left : left + 8],
        "given": np.array(image.shape),
    }


def test_a_transform_making_its_own_size_needs_no_image_size_and_is_not_resized(data):
    from reader.torch import TorchReader

    kw = dict(transform=centre_8, num_processes=2, **OPTS)
    got = list(reader.NumpyReader(data, "train", B, **kw))
    assert len(got) == 6 and all(b["image"].shape == (B, 8, 8, 3) for b in got)
    assert len({tuple(s) for b in got for s in b["given"]}) > 1  # decoded at their own sizes
    # image_size: the size the transform is given; what it returns goes out as it is
    sized = list(reader.NumpyReader(data, "train", B, image_size=(12, 12), **kw))
    assert all(b["image"].shape == (B, 8, 8, 3) for b in sized)
    assert all((b["given"] == [12, 12, 3]).all() for b in sized)
    ds = reader.make_dataset(data, "train", B, **kw)
    assert next(ds.as_numpy_iterator())["image"].shape == (B, 8, 8, 3)
    torch_batch = next(iter(TorchReader(data, "train", B, **{**kw, "num_processes": 0})))
    assert tuple(torch_batch["image"].shape) == (B, 8, 8, 3)
    # what does not stack is said in one line: make_dataset yields tensors
    with pytest.raises(TypeError, match=r"'image' holds arrays of \d+ shapes \(\(.*image_size="):
        reader.make_dataset(data, "train", B, transform=own_size, **OPTS)
    with pytest.raises(TypeError, match="'extra' holds NoneType and int values"):
        reader.make_dataset(data, "train", B, transform=extra_or_none, image_size=12, **OPTS)
    # without a transform the decoded images themselves must stack
    with pytest.raises(ValueError, match="decoded images differ in size"):
        reader.NumpyReader(data, "train", B, **OPTS)


def own_size(example, rng):
    """The image at its own size."""
    return {"image": example["image"], "label": example["label"]}


def bump(example, rng):
    """Changes its image in place."""
    example["image"] += 1
    return example


def _flipped(image):
    return np.asarray(image)[:, ::-1]


def test_mirror_views_pair_each_crop_with_its_mirror(data):
    kw = dict(random_crop=True, random_flip=True, image_size=12, views=4, num_processes=0)
    got = list(reader.NumpyReader(data, "train", B, mirror_views=True, **kw, **OPTS))
    for b in got:  # rows: 2 images x views 0..3
        image = b["image"]
        assert (image[1::2] == image[0::2][:, :, ::-1]).all()  # view 2k+1: 2k's, flipped
        assert not (image[0::4] == image[2::4]).all()  # two crops of an image
    plain = list(reader.NumpyReader(data, "train", B, **kw, **OPTS))
    for a, b in zip(got, plain):  # views 2k are drawn as without mirror_views
        assert (a["image"][0::2] == b["image"][0::2]).all()
    # no crop, a transform that changes its image in place: each view its own pixels
    bumped = list(
        reader.NumpyReader(
            data, "train", B, transform=bump, views=4, mirror_views=True, num_processes=2, **OPTS
        )
    )
    for b in bumped:
        for row in range(0, B, 4):
            v = b["image"][row : row + 4]
            assert (v[1] == _flipped(v[0])).all() and (v[3] == _flipped(v[2])).all()
            assert (v[2] == v[0]).all()
    with pytest.raises(ValueError, match="mirror_views"):
        reader.NumpyReader(data, "train", B, views=3, mirror_views=True, image_size=12, **OPTS)


def test_mirror_views_on_every_reader_with_views(data):
    from reader.torch import TorchReader

    kw = dict(views=2, mirror_views=True, image_size=12, random_crop=True, num_processes=0)
    want = list(reader.NumpyReader(data, "train", B, **kw, **OPTS))
    tf_batches = list(reader.make_dataset(data, "train", B, **kw, **OPTS).as_numpy_iterator())
    torch_batches = list(TorchReader(data, "train", B, **kw, **OPTS))
    for w, t, p in zip(want, tf_batches, torch_batches, strict=True):
        assert (w["image"][1::2] == w["image"][0::2][:, :, ::-1]).all()
        assert (t["image"] == w["image"]).all() and (p["image"].numpy() == w["image"]).all()
    # views spread batches apart: view 1 of a key is view 0's mirror
    spread = reader.NumpyReader(data, "train", B, view_spread=1, **kw, **OPTS)
    views = {(k, int(v)): im for b in spread for k, v, im in zip(b["key"], b["view"], b["image"])}
    assert len(views) == 48 * 2
    assert all((views[(k, 1)] == _flipped(views[(k, 0)])).all() for k, _ in views)


@pytest.mark.parametrize("transform", [None, extra_or_none])
def test_numpy_reader_refuses_decode_false_in_one_line(data, transform):
    """NumpyReader decodes every image (its transform is given pixels): decode=False is
    refused when the reader is built, not ignored (was: decoded images at their own
    sizes)."""
    with pytest.raises(ValueError) as raised:
        reader.NumpyReader(
            data, "train", B, transform=transform, num_processes=0, decode=False, **OPTS
        )
    message = str(raised.value)
    assert "\n" not in message and "decode=False" in message
    with pytest.raises(ValueError, match="decode=False"):
        reader.TorchReader(
            data, "train", B, transform=extra_or_none, num_processes=0, decode=False, **OPTS
        )


def weight_of(example, rng, late, odd):
    """``w`` 1 (an int), 0.5 (a float) on the keys of ``late``; with ``odd``, ``odd`` 3,
    and an array on those keys (a field that does not stack)."""
    out = {"image": example["image"][:4, :4], "w": 0.5 if example["key"] in late else 1}
    if odd:
        out["odd"] = np.zeros(2) if example["key"] in late else 3
    return out


def test_numbers_of_two_types_stack_and_make_dataset_never_casts_them_down(data):
    """A number field 1 on most keys, 0.5 on one of a later batch: stacked (was: a list
    of 0-d arrays); make_dataset, whose first batch held ints, refuses the floats (was:
    0.5 read as 0)."""
    plain = reader.NumpyReader(data, "train", B, num_processes=0, image_size=4, **OPTS)
    late = frozenset([[b["key"] for b in plain][-2][0]])
    transform = functools.partial(weight_of, late=late, odd=True)
    got = list(reader.NumpyReader(data, "train", B, transform=transform, num_processes=0, **OPTS))
    for b in got:
        assert isinstance(b["w"], np.ndarray)
        assert [w == 0.5 for w in b["w"]] == [k in late for k in b["key"]]
    # a field that does not stack comes as the transform returned it
    odd = [v for b in got if isinstance(b["odd"], list) for v in b["odd"]]
    assert [type(v) for v in odd].count(np.ndarray) == 1
    assert [v for v in odd if type(v) is not np.ndarray] == [3] * (len(odd) - 1)
    ds = reader.make_dataset(
        data, "train", B, transform=functools.partial(weight_of, late=late, odd=False), **OPTS
    )
    with pytest.raises(Exception, match="'w' holds float64 in the batch of key .*int64 in the"):
        list(ds)


def image_only(example, rng):
    """Returns the image itself, not a dict."""
    return example["image"]


class _Unprintable(Exception):
    def __str__(self):
        raise ValueError("no message")


def unprintable(example, rng):
    """Raises an exception whose message cannot be made."""
    raise _Unprintable()


@pytest.mark.parametrize("processes", [0, 2])
def test_a_transform_returning_no_dict_or_raising_the_unprintable_is_one_line(data, processes):
    """Each is one TransformError naming the transform and the key (was: 'dictionary
    update sequence element #0 has length 36'; a bare 'ValueError: no message')."""
    for transform, said in (
        (image_only, "image_only returned ndarray on key .*, not a dict"),
        (unprintable, r"unprintable failed on key .*_Unprintable"),
    ):
        r = reader.NumpyReader(
            data, "train", B, transform=transform, num_processes=processes, **OPTS
        )
        with pytest.raises(TransformError, match=said) as raised:
            list(r)
        assert "\n" not in str(raised.value)


def test_a_state_dict_given_as_state_and_a_bool_batch_size_are_one_line(data):
    """state= takes a ReadState; a reader's state_dict() there is one TypeError saying
    where it goes (was: AttributeError: 'dict' object has no attribute 'to_json'); and
    NumpyReader's batch_size True is refused as make_dataset's is (was: batches of 1)."""
    from reader.torch import TorchReader

    kw = dict(image_size=8, **OPTS)
    saved = reader.NumpyReader(data, "train", B, num_processes=0, **kw).state_dict()
    faces = (
        functools.partial(reader.NumpyReader, num_processes=0),
        reader.make_dataset,
        functools.partial(TorchReader, num_processes=0),
    )
    for face in faces:
        with pytest.raises(TypeError, match=r"state= takes a ReadState.*load_state_dict"):
            face(data, "train", B, state=saved, **kw)
    with pytest.raises(TypeError, match="batch_size must be a whole number"):
        reader.NumpyReader(data, "train", True, num_processes=0, **kw)
