"""The read options in groups: each group checks itself, ``ReadOptions`` keeps the flat
keywords users type and is made of the groups, and a face refuses an option of a group
it does not take in one line naming the option and the face."""

from __future__ import annotations

import dataclasses

import pytest

import reader
from reader.values.option_groups import GROUPS, ImageOptions, OrderOptions, refuse_untaken

pytestmark = pytest.mark.fast
START = {"start_epoch", "start_step"}  # a read's start: its ReadState, no group's


def test_every_flat_option_is_in_exactly_one_group_but_the_start():
    flat = [f.name for f in dataclasses.fields(reader.ReadOptions)]
    grouped = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == set(flat) - START
    # each group's defaults are the flat defaults
    default = reader.ReadOptions()
    for name, group in GROUPS.items():
        assert getattr(default, name) == group(), name


def test_the_flat_keywords_make_the_groups_as_the_groups_normalize_them():
    options = reader.ReadOptions(
        seed=3, image_size=32, crop_scale=(1, 1), num_workers=2, worker_index=1
    )
    assert options.ordering == OrderOptions(seed=3)
    assert options.images == ImageOptions(image_size=(32, 32), crop_scale=(1.0, 1.0))
    assert options.image_size == (32, 32) and options.crop_scale == (1.0, 1.0)
    assert options.workers() == options.sharding.workers() == (2, 1)
    moved = dataclasses.replace(options, seed=4, prefetch=2)
    assert moved.ordering.seed == 4 and moved.tuning.prefetch == 2 and moved.image_size == (32, 32)


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(epochs=0), ValueError, "epochs must be >= 1"),
        (dict(seed=1.0), TypeError, "seed must be a whole number"),
        (dict(worker_index=0), ValueError, "num_workers and worker_index go together"),
        (dict(image_size=(0, 3)), ValueError, "image_size must be"),
        (dict(cache_limit=0), ValueError, "cache_limit must be >= 1"),
        (dict(on_error="skip"), ValueError, "give error_ledger"),
        (dict(prefetch=2.0), TypeError, "prefetch must be a whole number"),
        (dict(start_step=-1), ValueError, "start_epoch and start_step must be >= 0"),
    ],
)
def test_each_group_checks_itself_through_the_flat_keywords(kw, error, match):
    with pytest.raises(error, match=match):
        reader.ReadOptions(**kw)


def test_refuse_untaken_names_the_changed_options_of_an_untaken_group_in_one_line():
    options = reader.ReadOptions(prefetch=2, num_parallel_calls=4, seed=1)
    refuse_untaken(options, frozenset(GROUPS), "F", {})  # takes everything
    refuse_untaken(reader.ReadOptions(), frozenset(), "F", {})  # defaults pass
    with pytest.raises(ValueError) as e:
        refuse_untaken(options, frozenset(GROUPS) - {"tuning"}, "F", {"tuning": "do X"})
    assert str(e.value) == "F does not honour prefetch, num_parallel_calls: do X"


def flip(example, rng):
    return example


@pytest.mark.parametrize(
    "read, option, face",
    [
        (lambda **kw: reader.NumpyReader("nowhere/", "train", 4, **kw), "prefetch", "NumpyReader"),
        (
            lambda **kw: reader.NumpyReader("nowhere/", "train", 4, **kw),
            "as_supervised",
            "NumpyReader",
        ),
        (
            lambda **kw: reader.make_dataset(
                "nowhere/", "train", 4, on_error="skip", error_ledger="l", **kw
            ),
            "prefetch_to_device",
            'make_dataset(on_error="skip")',
        ),
        (
            lambda **kw: reader.make_dataset("nowhere/", "train", 4, transform=flip, **kw),
            "as_supervised",
            "make_dataset(transform=...)",
        ),
        (
            lambda **kw: reader.TorchReader("nowhere/", "train", 4, image_size=8, **kw),
            "prefetch_to_device",
            "TorchReader",
        ),
    ],
)
def test_a_face_refuses_an_option_of_a_group_it_does_not_take_before_reading(read, option, face):
    value = {
        "prefetch": 4,
        "as_supervised": True,
        "on_error": "skip",
        "prefetch_to_device": "/gpu:0",
    }[option]
    extra = {"error_ledger": "ledger"} if option == "on_error" else {}
    with pytest.raises(ValueError) as e:
        read(**{option: value}, **extra)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{face} does not honour {option}")


def test_the_python_stage_is_one_group_with_one_rule():
    """The Python stage's keywords are one frozen group (a dict in make_dataset, a
    4-tuple in TorchReader, flat keywords in NumpyReader before), checked in one place,
    with the one rule for when a read takes the Python route; every face refuses a bad
    value before reading, with the same line."""
    from reader.values.option_groups import PythonStage

    assert not PythonStage().needed() and PythonStage().needed("skip")
    assert PythonStage(views=2).needed() and PythonStage(mirror_views=True).needed()
    assert PythonStage(transform=flip).needed()
    with pytest.raises(TypeError, match="transform must be a function"):
        PythonStage(transform=3)
    faces = (
        lambda **kw: reader.make_dataset("nowhere/", "train", 4, **kw),
        lambda **kw: reader.NumpyReader("nowhere/", "train", 4, **kw),
        lambda **kw: reader.TorchReader("nowhere/", "train", 4, image_size=8, **kw),
    )
    for read in faces:
        with pytest.raises(ValueError, match="num_processes must be a whole number >= 0, got -1"):
            read(transform=flip, num_processes=-1)
        for bad in (1.5, True, "2"):  # a count that is no int: a TypeError, as every count
            with pytest.raises(
                TypeError, match=f"num_processes must be a whole number \\(int\\), got {bad!r}"
            ):
                read(transform=flip, num_processes=bad)
