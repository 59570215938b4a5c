"""The packages form a stack: schemas at the bottom, convert's core (convert_core) and the
reader on it, Beam's convert (beam_jobs) over the core and the tools (audit) over the
reader, the CLI on top."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# package -> its floor; a module may import only packages on a lower floor (and its own).
FLOORS = {
    "schemas": 0,
    "convert_core": 1,
    "reader": 1,
    "beam_jobs": 2,
    "audit": 2,
    "evenshard": 3,
}


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
    """Every module of every package, subpackages included (reader/order/ is one)."""
    for package in FLOORS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    yield package, os.path.relpath(os.path.join(folder, name), ROOT)


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
    # subpackages are walked too: the order floor's modules are checked
    assert os.path.join("reader", "order", "plan.py") in {rel for _, rel in _modules()}
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
    loaded = _loaded_after("import convert_core.walk, convert_core.candidates, schemas.images")
    assert not loaded & {"apache_beam", "tensorflow"}


def test_no_module_of_convert_s_core_imports_beam(tmp_path):
    """No import of ``apache_beam`` anywhere in ``convert_core``, at module level or in a
    function; none loaded by importing every module of it (what they import stays on
    the floors below: schemas, and convert_core itself)."""
    core = [rel for package, rel in _modules() if package == "convert_core"]
    assert os.path.join("convert_core", "inspection.py") in core
    beam = [rel for rel in core if "apache_beam" in _imports(os.path.join(ROOT, rel))]
    assert not beam, "convert_core modules importing apache_beam:\n" + "\n".join(beam)
    names = ", ".join(rel[:-3].replace(os.sep, ".").removesuffix(".__init__") for rel in core)
    assert "apache_beam" not in _loaded_after(f"import {names}")
    # the check sees an import in a function
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from apache_beam.io.filesystems import FileSystems\n")
    assert "apache_beam" in _imports(str(bad))


def test_a_record_format_is_named_in_the_registry_and_its_source_module_alone():
    """Each ``--input_format`` of records is a row of ``RECORD_FORMATS``: no other module
    of the product spells its name as a string (the TFDS dataset's own ``fileFormat``
    value, read in its source module, is the data's); a folder's formats are found by
    the rows (their name patterns, any case; the files beside a TFDS folder's records)."""
    from convert_core.options import RECORD_FORMATS
    from convert_core.record_rules import record_input_formats

    spelled = []
    for package, rel in _modules():
        if package in ("tests", "benchmarks"):
            continue
        with open(os.path.join(ROOT, rel)) as f:
            strings = {
                n.value
                for n in ast.walk(ast.parse(f.read()))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
        for name, row in RECORD_FORMATS.items():
            own = rel in ("convert_core/options.py", row.module.replace(".", "/") + ".py")
            data = (rel, name) == ("beam_jobs/tfds_source.py", "tfrecord")  # fileFormat's
            if name in strings and not (own or data):
                spelled.append(f"{rel}: {name!r}")
    assert not spelled, spelled
    names = ["a.tfrecord", "b.PARQUET", "c.Tar.Gz", ".hidden/d.tar", "x/e.tfrecord-00000-of-00001"]
    assert record_input_formats(names) == {
        "tfrecord": ["a.tfrecord", "x/e.tfrecord-00000-of-00001"],
        "parquet": ["b.PARQUET"],
        "webdataset": ["c.Tar.Gz"],
    }
    tfds = ["dataset_info.json", "features.json", "m-train.tfrecord-00000-of-00001"]
    assert record_input_formats(tfds) == {"tfds": tfds[2:]}
    assert record_input_formats(["a.tfrecord", "b.png"]) == {}  # an image folder


def test_import_reader_and_the_cli_are_light():
    heavy = {"apache_beam", "tensorflow", "torch", "nvidia"}
    assert not _loaded_after("import reader, evenshard.cli") & heavy


def test_reader_exports_every_entry_point_lazily():
    import reader

    for name in reader.__all__:
        assert getattr(reader, name) is not None, name
    assert reader.make_dali_pipeline.__module__ == "reader.dali"
    assert reader.TorchReader.__module__ == "reader.torch"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    """A dataset converted from 8 images (Beam runs here, in the test process)."""
    from evenshard.synthetic import make_image_folder

    tmp = tmp_path_factory.mktemp("layers")
    make_image_folder(str(tmp / "images"), num_labels=2, per_label=4)
    from beam_jobs import convert

    convert.run([f"--input={tmp / 'images'}", f"--output_dir={tmp / 'out'}"])
    return str(tmp / "out")


ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _read(out: str, first: str = "") -> subprocess.CompletedProcess:
    """A training script reading the dataset (after ``first``): it prints the batch
    count, then the modules it loaded."""
    code = (
        "import reader\n"
        f"ds = reader.make_dataset({out!r}, 'train', 2, image_size=(8, 8))\n"
        "print(len(list(ds)))\n"
        "import sys\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    return subprocess.run(
        [sys.executable, "-c", first + code], capture_output=True, text=True, env=ENV, cwd=ROOT
    )


@pytest.fixture(scope="module")
def plain_read(converted) -> subprocess.CompletedProcess:
    """One read by a script that imports nothing else (TensorFlow starts once for both
    tests that look at it)."""
    return _read(converted)


def test_training_never_imports_beam(plain_read):
    assert plain_read.returncode == 0, plain_read.stderr[-3000:]
    loaded = {m.split(".")[0] for m in plain_read.stdout.splitlines()[-1].split()}
    assert "tensorflow" in loaded and "apache_beam" not in loaded


def test_reading_and_validating_print_no_tensorflow_start_up_lines(converted, plain_read, tmp_path):
    """No absl, CUDA or cuInit lines on a machine without a GPU (TF's C++ writes them to fd 2)."""
    out = converted
    env = ENV
    # JAX first: absl starts before TensorFlow, whose log level filter then misses cuInit
    for first, read in (("", plain_read), ("import jax\n", _read(out, "import jax\n"))):
        assert read.returncode == 0 and read.stderr == "", (first, read.stderr)
        assert int(read.stdout.splitlines()[0]) > 0, (first, read.stdout[:200])
    evenshard = os.path.join(os.path.dirname(sys.executable), "evenshard")
    report = ["shuffle-report", out, "--batch_size=2", f"--out={tmp_path / 'r.png'}"]
    for argv in (["validate", out, "--full"], ["inspect", out], ["--version"], report):
        done = subprocess.run([evenshard, *argv], capture_output=True, text=True, env=env)
        assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)


# Inside the reader: modules on floors, each importing only its own floor or lower
# (docs/design.md, "The reader's floors"). A sub-package is one floor, given by its
# prefix; reader/'s top holds the faces and the two modules users import by path, each
# named. A module without a floor fails the test.
READER_FLOORS = {
    "reader/order/": 0,  # the order: pure numpy functions of ints
    "reader/values/": 1,  # options, state, mixture, a split's shards, one_line
    "reader/compat/": 1,  # other libraries' private names, one module each
    "reader/front/": 2,  # the read's one front door; a split's keys, the excluded ones
    "reader/records/": 3,  # records in read order
    "reader/cache/": 3,  # the bucket cache
    "reader/decode/": 3,  # decoding
    "reader/routes/": 4,  # the spine's decode stages and routes (no face's)
    "reader/examples.py": 3,  # users import these two by path: reader.examples,
    "reader/explain.py": 3,  # reader.explain (README)
    "reader/pipeline.py": 5,  # the faces
    "reader/dali.py": 5,
    "reader/torch.py": 5,
    "reader/arrays.py": 5,
    "reader/handover.py": 5,  # the torch face's: DataLoader workers' batches counted
    "reader/__init__.py": 5,
    "reader/__main__.py": 5,
}
# the most modules reader/'s top may hold (the faces, and what users import by path)
TOP_MODULES = 15
# which modules may import each engine
ENGINES = {
    "tensorflow": {
        "reader/pipeline.py",
        "reader/records/stream.py",
        "reader/decode/tf_decode.py",
        "reader/records/tfcall.py",
        "reader/routes/graph.py",
        "reader/routes/tf_adapter.py",
        "reader/compat/tf.py",
        "reader/examples.py",  # pass-through records: tf.io.parse_example
    },
    "torch": {
        "reader/torch.py",
        "reader/routes/torch_tensors.py",
        "reader/routes/torch_backend.py",
        "reader/routes/torch_spread.py",
        "reader/routes/torch_read.py",
        "reader/routes/torch_device.py",
        "reader/compat/torch.py",
    },
    "nvidia": {"reader/routes/dali_decode.py"},
}
# The faces: thin adapters over the one spine, side by side (docs/design.md, "One spine").
FACES = {"reader/pipeline.py", "reader/arrays.py", "reader/torch.py", "reader/dali.py"}


def _reader_modules() -> dict[str, str]:
    """module name (reader.order.plan) -> path relative to the root."""
    out = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "reader")):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)
                module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
                out[module] = rel
    return out


def _floor(rel: str) -> int:
    """A module's floor: its own entry, or its package's (the longest prefix)."""
    if rel in READER_FLOORS:
        return READER_FLOORS[rel]
    prefixes = [p for p in READER_FLOORS if p.endswith("/") and rel.startswith(p)]
    if not prefixes:
        raise AssertionError(f"{rel} has no floor in READER_FLOORS")
    return READER_FLOORS[max(prefixes, key=len)]


def _reader_imports(rel: str) -> list[tuple[str, list[str]]]:
    """(imported module, names) of every import in a module."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read(), rel)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [a.name for a in node.names]))
    return out


def test_the_reader_s_floors_point_down_with_no_circle_and_no_private_name():
    modules = _reader_modules()
    up, private, engines, graph = [], [], [], {}
    for module, rel in modules.items():
        graph[module] = set()
        for imported, names in _reader_imports(rel):
            top = imported.split(".")[0]
            for engine, allowed in ENGINES.items():
                if top == engine and rel not in allowed:
                    engines.append(f"{rel} imports {engine}")
            if top != "reader":
                continue
            # from reader.compat import mp: the module it imports is reader.compat.mp
            targets = {f"{imported}.{n}" for n in names} & set(modules)
            if not targets and imported == "reader":
                continue  # import reader: the faces' names, each imported on first use
            if not targets:
                targets = {imported if imported in modules else imported.rsplit(".", 1)[0]}
            for target in sorted(targets):
                graph[module].add(target)
                if _floor(modules[target]) > _floor(rel):
                    up.append(f"{rel} imports {target}")
            private += [f"{rel} imports {imported}.{n}" for n in names if n.startswith("_")]
    assert not up, "imports running up inside reader/:\n" + "\n".join(up)
    assert not private, "private names imported across modules:\n" + "\n".join(private)
    assert not engines, "engines imported outside their face:\n" + "\n".join(engines)
    # no circle: a depth-first walk never meets a module on its own path
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            assert state.get(n) != 1, "a circle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_the_order_floor_imports_numpy_alone():
    """The order takes ints and gives ints: no options, no format, no engine (its errors
    are the project's one root's kinds: schemas.errors imports nothing)."""
    allowed = {"__future__", "dataclasses", "functools", "hashlib", "math", "numpy", "reader.order"}
    allowed.add("schemas.errors")
    for module, rel in _reader_modules().items():
        if module.startswith("reader.order"):
            for imported, _ in _reader_imports(rel):
                assert imported in allowed or imported.startswith("reader.order."), (rel, imported)


def _faces_imported(rel: str, modules: dict[str, str]) -> set[str]:
    """The face modules a reader module imports (at module level or in a function)."""
    out = set()
    for imported, names in _reader_imports(rel):
        candidates = {imported} | {f"{imported}.{n}" for n in names}
        out |= {modules[m] for m in candidates if m in modules and modules[m] in FACES}
    return out - {rel}


def test_no_face_imports_another_face(tmp_path):
    """Each face stands on the spine, beside the others: the tf.data face's transform=
    path and TorchReader's backends go through the spine, not through another face."""
    modules = _reader_modules()
    assert FACES <= set(modules.values())
    wrong = [f"{rel} imports {face}" for rel in FACES for face in _faces_imported(rel, modules)]
    assert not wrong, "faces standing on faces:\n" + "\n".join(sorted(wrong))
    # the check sees both import forms, in a function too
    bad = tmp_path / "reader" / "face.py"
    bad.parent.mkdir()
    bad.write_text("from reader import arrays\ndef f():\n    import reader.dali\n")
    found = _faces_imported(str(bad), modules)
    assert found == {"reader/arrays.py", "reader/dali.py"}


def test_the_reader_s_top_holds_the_faces_and_each_sub_package_one_floor():
    """reader/'s top holds at most TOP_MODULES modules: the faces (floor 5) and the two
    modules users import by path, examples.py and explain.py (floor 3), so the top spans
    floors 3 and 5. Every other module lives in a sub-package, whose modules all share
    one floor, and which has an __init__.py (setup.py's find_packages ships only those).
    Every module has a floor, imported by another module or not."""
    top = sorted(n for n in os.listdir(os.path.join(ROOT, "reader")) if n.endswith(".py"))
    assert len(top) <= TOP_MODULES, f"{len(top)} modules at reader/'s top: {top}"
    assert {os.path.basename(face) for face in FACES} <= set(top)
    floors: dict[str, dict[str, int]] = {}
    for rel in _reader_modules().values():
        floors.setdefault(os.path.dirname(rel), {})[rel] = _floor(rel)
    assert set(floors.pop("reader").values()) == {3, 5}
    for folder, by_module in sorted(floors.items()):
        assert os.path.isfile(os.path.join(ROOT, folder, "__init__.py")), folder
        assert len(set(by_module.values())) == 1, f"{folder} spans floors: {by_module}"
    # a module's own entry comes before its package's: the check above would see it
    READER_FLOORS["reader/routes/graph.py"] = 3
    try:
        assert _floor(os.path.join("reader", "routes", "graph.py")) == 3
        assert _floor(os.path.join("reader", "routes", "python_route.py")) == 4
    finally:
        del READER_FLOORS["reader/routes/graph.py"]


def test_mallopt_makes_large_arrays_reuse_the_heap():
    """The one ctypes call the reader's workers and convert's processes tune their heap
    with (``schemas.malloc``): with the preprocessing workers' settings, a 4 MB array
    made and freed again and again reuses the heap's pages instead of mapping fresh ones
    (each faulted in anew), as it does by glibc's defaults."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt: Linux")
    code = """
import resource, sys
import numpy as np
from numpy._core.multiarray import _set_madvise_hugepage
from schemas.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt
# numpy asks for huge pages for arrays of 4 MB: where the kernel grants them, a fresh
# mapping faults 2 MB at a time (the full suite once counted 151 faults, not 51,200)
_set_madvise_hugepage(False)
if sys.argv[1] == "tuned":
    assert mallopt([(M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 64 << 20)])
else:
    assert mallopt([(M_MMAP_THRESHOLD, 128 << 10)])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    np.ones(4 << 20, np.uint8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = {
        how: int(
            subprocess.run(
                [sys.executable, "-c", code, how],
                capture_output=True,
                text=True,
                check=True,
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            ).stdout
        )
        for how in ("mapped", "tuned")
    }
    assert faults["mapped"] > 10 * 1024  # 50 arrays of 1,024 pages each, mapped anew
    assert faults["tuned"] < faults["mapped"] / 10, faults
