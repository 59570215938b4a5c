"""Convert's core runs without Beam: the tests' in-process writer (``dataset_writing``),
which runs ``convert_core`` alone, writes a dataset in a process where ``apache_beam``
cannot be imported; and it writes what a Beam convert writes for the inputs its older
self refused (symlinks in the folder, ``--group_by``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import files_of, run_convert, write_manifest
from dataset_writer import write_dataset

from evenshard import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# apache_beam refused in the subprocess: a finder first on the path raises for it and
# for each of its modules, and a module cached as None is refused too.
_NO_BEAM = """
import importlib.abc
import sys


class NoBeam(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "apache_beam" or name.startswith("apache_beam."):
            raise ImportError(f"{name} is blocked in this test")
        return None


sys.meta_path.insert(0, NoBeam())
sys.modules["apache_beam"] = None
"""

_WRITE = """
import json
import pkgutil
import sys

import convert_core

for module in pkgutil.iter_modules(convert_core.__path__):
    __import__(f"convert_core.{module.name}")
from dataset_writing import write_dataset

info = write_dataset(*sys.argv[1:])
print(json.dumps({"info": info, "beam": sorted(m for m in sys.modules if "apache_beam" in m)}))
"""


def test_the_core_and_the_test_writer_write_a_dataset_with_beam_blocked(tmp_path):
    images = str(tmp_path / "images")
    broken = synthetic.make_image_folder(images, num_labels=2, per_label=6, broken=True)
    out = str(tmp_path / "out")
    flags = ["--splits=train=0.5,val=0.5", "--num_shards=2", "--max_reject_fraction=0.5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    done = subprocess.run(
        [sys.executable, "-c", _NO_BEAM + _WRITE, images, out, *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["beam"] == ["apache_beam"]  # the refusal (None) only: no module of Beam
    info = found["info"]
    assert info["inputs"] == 12 + len(broken)
    assert info["rejects"]["total"] == len(broken)
    assert sum(s["num_examples"] for s in info["splits"].values()) == 12
    assert sorted(info["splits"]) == ["train", "val"]
    assert os.path.exists(os.path.join(out, "dataset_info.json"))


def test_the_block_refuses_beam():
    """The block above is one: Beam, or a module of it, cannot be imported under it."""
    tries = "import apache_beam", "import apache_beam.io.filesystems", "from apache_beam import Map"
    code = "".join(f"try:\n    {t}\nexcept ImportError:\n    print('refused')\n" for t in tries)
    done = subprocess.run(
        [sys.executable, "-c", _NO_BEAM + code], capture_output=True, text=True, cwd=ROOT
    )
    assert done.stdout.split() == ["refused"] * 3, done.stderr[-2000:]


def _same_as_beam(source: str, tmp_path, *flags: str) -> dict:
    flags = (*flags, "--max_reject_fraction=0.5")
    beam = run_convert(source, str(tmp_path / "beam"), *flags, validated=False)
    fast = write_dataset(source, str(tmp_path / "fast"), *flags)
    written, expected = files_of(tmp_path / "fast"), files_of(tmp_path / "beam")
    assert sorted(written) == sorted(expected)
    assert [n for n in expected if written[n] != expected[n]] == []
    beam.pop("runner")
    assert fast == beam
    return fast


def test_a_folder_with_symlinks_is_written_as_convert_writes_it(tmp_path):
    """Pass 2 of the walk (``walk.follow_links``) in one process: a link to a file of the
    tree is a ``duplicate_file``, a link to a folder outside it an input, a broken link
    a ``missing`` reject."""
    images = tmp_path / "images"
    synthetic.make_image_folder(str(images), num_labels=2, per_label=5)
    outside = tmp_path / "outside"
    synthetic.make_image_folder(str(outside), num_labels=1, per_label=3)
    first = sorted(os.listdir(images / "label_0"))[0]
    os.symlink(images / "label_0" / first, images / "label_1" / "alias.png")
    os.symlink(outside / "label_0", images / "label_1" / "more")
    os.symlink(tmp_path / "nowhere.png", images / "label_0" / "broken.png")
    info = _same_as_beam(str(images), tmp_path, "--num_shards=2")
    assert info["rejects"]["by_reason"] == {"duplicate_file": 1, "missing": 1}
    assert sum(s["num_examples"] for s in info["splits"].values()) == 13


def test_a_manifest_with_groups_is_written_as_convert_writes_it(tmp_path):
    """``--group_by`` in one process (``listing.unique``): a group in one split, the one
    its rows give; a group given two splits all ``bad_split``."""
    images = tmp_path / "images"
    synthetic.make_image_folder(str(images), num_labels=2, per_label=8)
    files = sorted(
        f"images/{label}/{name}"
        for label in os.listdir(images)
        for name in os.listdir(images / label)
    )
    rows = [
        {"path": f, "label": f.split("/")[1], "group": f"g{i % 5}", "split": ""}
        for i, f in enumerate(files)
    ]
    rows[0]["split"] = "val"  # group g0 follows it
    rows[1]["split"], rows[6]["split"] = "train", "val"  # g1 given two: bad_split
    manifest = write_manifest(str(tmp_path / "m.csv"), rows, ["path", "label", "group", "split"])
    info = _same_as_beam(manifest, tmp_path, "--group_by=group", "--num_shards=1")
    assert info["rejects"]["by_reason"] == {
        "bad_split": len([r for r in rows if r["group"] == "g1"])
    }
