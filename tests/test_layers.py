"""The packages form a stack: schemas at the bottom, beam_jobs and reader on it, the tools
(audit) above the reader, the CLI on top."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# package -> its floor; a module may import only packages on a lower floor (and its own).
FLOORS = {"schemas": 0, "beam_jobs": 1, "reader": 1, "audit": 2, "evenshard": 3}


def _imports(path: str) -> set[str]:
    """Top-level packages a module imports, at module level or inside functions."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _modules():
    for package in FLOORS:
        for name in sorted(os.listdir(os.path.join(ROOT, package))):
            if name.endswith(".py"):
                yield package, os.path.join(package, name)


def test_every_import_between_the_packages_points_down():
    wrong = []
    for package, rel in _modules():
        for imported in _imports(os.path.join(ROOT, rel)) & set(FLOORS):
            if imported != package and FLOORS[imported] >= FLOORS[package]:
                wrong.append(f"{rel} imports {imported}")
    assert not wrong, "imports running up or sideways:\n" + "\n".join(wrong)


def test_the_walk_sees_every_package_and_catches_a_wrong_arrow(tmp_path):
    seen = {package for package, _ in _modules()}
    assert seen == set(FLOORS)
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from reader import pipeline\n")
    assert _imports(str(bad)) == {"reader"}


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


def test_the_format_layer_imports_neither_beam_nor_tensorflow():
    loaded = _loaded_after(
        "import schemas, schemas.info, schemas.layout, schemas.features, schemas.tfrecord, "
        "schemas.example, schemas.storage, schemas.images, schemas.progress, "
        "audit.validate, audit.summary"
    )
    assert not loaded & {"apache_beam", "tensorflow"}


def test_the_folder_walk_and_the_input_rules_import_no_beam():
    loaded = _loaded_after("import beam_jobs.walk, beam_jobs.candidates, schemas.images")
    assert not loaded & {"apache_beam", "tensorflow"}


def test_import_reader_and_the_cli_are_light():
    heavy = {"apache_beam", "tensorflow", "torch", "nvidia"}
    assert not _loaded_after("import reader, evenshard.cli") & heavy


def test_reader_exports_every_entry_point_lazily():
    import reader

    for name in reader.__all__:
        assert getattr(reader, name) is not None, name
    assert reader.make_dali_pipeline.__module__ == "reader.dali"
    assert reader.TorchReader.__module__ == "reader.torch"


def test_training_never_imports_beam(tmp_path):
    from evenshard.synthetic import make_image_folder

    make_image_folder(str(tmp_path / "images"), num_labels=2, per_label=4)
    from beam_jobs import convert

    convert.run([f"--input={tmp_path / 'images'}", f"--output_dir={tmp_path / 'out'}"])
    loaded = _loaded_after(
        "import reader\n"
        f"ds = reader.make_dataset({str(tmp_path / 'out')!r}, 'train', 2, image_size=(8, 8))\n"
        "next(iter(ds))"
    )
    assert "tensorflow" in loaded and "apache_beam" not in loaded


def test_reading_and_validating_print_no_tensorflow_start_up_lines(tmp_path):
    """No absl, CUDA or cuInit lines on a machine without a GPU (TF's C++ writes them to fd 2)."""
    from evenshard.synthetic import make_image_folder

    make_image_folder(str(tmp_path / "images"), num_labels=2, per_label=4)
    from beam_jobs import convert

    out = str(tmp_path / "out")
    convert.run([f"--input={tmp_path / 'images'}", f"--output_dir={out}"])
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    code = (
        "import reader\n"
        f"ds = reader.make_dataset({out!r}, 'train', 2, image_size=(8, 8))\n"
        "print(len(list(ds)))"
    )
    # JAX first: absl starts before TensorFlow, whose log level filter then misses cuInit
    for first in ("", "import jax\n"):
        read = subprocess.run(
            [sys.executable, "-c", first + code], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert read.returncode == 0 and read.stderr == "", (first, read.stderr)
    evenshard = os.path.join(os.path.dirname(sys.executable), "evenshard")
    report = ["shuffle-report", out, "--batch_size=2", f"--out={tmp_path / 'r.png'}"]
    for argv in (["validate", out, "--full"], ["inspect", out], ["--version"], report):
        done = subprocess.run([evenshard, *argv], capture_output=True, text=True, env=env)
        assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)
