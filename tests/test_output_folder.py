"""The output folder: convert removes exactly the files earlier runs recorded as theirs."""

from __future__ import annotations

import os

import pytest
from conftest import load_info, run_convert, write_pngs

from audit.validate import validate
from convert_core.options import UserError
from schemas import layout

USERS = [
    "train-00000-of-00016.tfrecord.bak",
    "other-00000-of-00009.tfrecord",
    "data.tmp-1",
    "rejects/mine.txt",
    "labels.txt.tmp-1",
]


def _write_users_files(out):
    for name in USERS:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            f.write("mine")


def _assert_users_files_kept(out):
    for name in USERS:
        with open(os.path.join(out, name)) as f:
            assert f.read() == "mine", name


def test_overwrite_removes_only_the_files_the_dataset_lists(tmp_path):
    write_pngs(tmp_path / "img", 12)
    out = str(tmp_path / "out")
    run_convert(str(tmp_path / "img"), out, "--splits=train=1.0", "--num_shards=4")
    _write_users_files(out)
    info = run_convert(
        str(tmp_path / "img"),
        out,
        "--splits=train=1.0",
        "--num_shards=2",
        "--overwrite",
        validated=False,
    )
    _assert_users_files_kept(out)
    # the user's look-alike is reported, not removed
    assert [p.split("/")[-1] for p in validate(out)] == [
        "other-00000-of-00009.tfrecord: stray shard file, not listed in dataset_info.json"
    ]
    shards = sorted(n for n in os.listdir(out) if n.startswith("train-"))
    assert shards == sorted(
        [s["file"] for s in info["splits"]["train"]["shards"]]
        + [s["dali_index"] for s in info["splits"]["train"]["shards"]]
        + ["train-00000-of-00016.tfrecord.bak"]
    )  # the 4 shards of the first run are gone, the user's look-alike stays


def test_a_dead_runs_shards_are_removed_by_its_records(tmp_path):
    """A run killed after renaming some shards into place (no dataset_info.json): the
    next run removes the shards it recorded in .incomplete/, not look-alikes."""
    write_pngs(tmp_path / "img", 12)
    out = tmp_path / "out"
    (out / layout.INCOMPLETE_DIR).mkdir(parents=True)
    (out / layout.MARKER_FILE).write_text("")
    dead = layout.shard_name("train", 0, 3)
    for name in (dead, layout.index_name(dead)):
        (out / name).write_text("half a run")
    (out / layout.INCOMPLETE_DIR / (dead + layout.OWNED_SUFFIX)).write_text("")
    (out / layout.INCOMPLETE_DIR / (dead + ".0123")).write_text("a temp shard")
    _write_users_files(str(out))
    run_convert(
        str(tmp_path / "img"), str(out), "--splits=train=1.0", "--num_shards=2", validated=False
    )
    assert len(validate(str(out))) == 1  # the user's other-00000-of-00009.tfrecord
    assert not (out / dead).exists() and not (out / layout.index_name(dead)).exists()
    assert not (out / layout.INCOMPLETE_DIR).exists()
    _assert_users_files_kept(str(out))
    assert load_info(str(out))["splits"]["train"]["num_examples"] == 12


def test_a_labels_file_anywhere_inside_the_output_is_refused(tmp_path):
    write_pngs(tmp_path / "img", 12)
    out = tmp_path / "out"
    (out / "rejects").mkdir(parents=True)
    vocab = out / "rejects" / "vocab.txt"
    vocab.write_text("l0\nl1\n")
    with pytest.raises(UserError, match="holds the --labels file"):
        run_convert(str(tmp_path / "img"), str(out), f"--labels={vocab}")
    assert vocab.read_text() == "l0\nl1\n"


def test_the_real_folder_behind_a_symlinked_label_folder_is_refused(tmp_path):
    write_pngs(tmp_path / "elsewhere" / "real", 12)
    (tmp_path / "img").mkdir()
    os.symlink(tmp_path / "elsewhere" / "real" / "l0", tmp_path / "img" / "l0")
    for out in (
        tmp_path / "elsewhere" / "real" / "l0",
        tmp_path / "elsewhere" / "real" / "l0" / "x",
    ):
        with pytest.raises(UserError, match="label folder l0 is a link"):
            run_convert(str(tmp_path / "img"), str(out))
    assert sorted(os.listdir(tmp_path / "elsewhere" / "real" / "l0")) == [
        f"{i}.png" for i in (0, 10, 2, 4, 6, 8)
    ]


@pytest.mark.fast
@pytest.mark.parametrize("name", ["run[1]", "run*", "run?"])
def test_an_output_folder_named_with_wildcards_is_itself(tmp_path, name):
    """``*``, ``?`` and ``[`` in the output folder's name are no pattern: a dead run's
    recorded shards there are removed, and a sibling folder's shards are not taken for
    files in it (which made a new folder refused)."""
    from convert_core.output import _prepare

    sibling = tmp_path / "run1"
    sibling.mkdir()
    (sibling / layout.shard_name("train", 0, 2)).write_text("another dataset's")
    out = tmp_path / name
    _prepare(str(out), str(out / layout.INCOMPLETE_DIR), False)  # a new folder: not refused
    (out / layout.INCOMPLETE_DIR).mkdir()
    dead = layout.shard_name("train", 0, 3)
    (out / dead).write_text("half a run")
    (out / layout.INCOMPLETE_DIR / (dead + layout.OWNED_SUFFIX)).write_text("")
    _prepare(str(out), str(out / layout.INCOMPLETE_DIR), False)
    assert sorted(os.listdir(out)) == [layout.MARKER_FILE]
    assert (sibling / layout.shard_name("train", 0, 2)).exists()
