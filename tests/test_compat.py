"""Other libraries' internals in one place each: the compat modules.

Each compat module (``reader/compat/*.py``, ``beam_jobs/compat_beam.py``) holds every
private name of one library that evenshard touches and a ``check()`` that fails, naming
the name and the installed version, when a release moves it. The grep below keeps those
names out of every other module."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "reader", "convert_core", "beam_jobs", "audit", "evenshard")
COMPAT = {
    "reader/compat/torch.py": "torch",
    "reader/compat/tf.py": "tensorflow",
    "reader/compat/mp.py": "multiprocessing",
    "beam_jobs/compat_beam.py": "apache_beam",
}
LIBRARIES = ("torch", "torchdata", "tensorflow", "apache_beam", "multiprocessing")
# packages of those libraries that are theirs alone, whatever the names in them
INTERNAL_PACKAGES = ("tensorflow.python", "apache_beam.internal", "torch.utils.data._utils")
# underscore names that are public API: namedtuple's methods, os._exit
PUBLIC = {"_replace", "_asdict", "_fields", "_make", "_exit"}
# private names of libraries other than those above (test servers, not a reader's path)
OTHERS = {
    ("evenshard/emulator.py", "_content"),  # requests.Response
    ("evenshard/emulator.py", "_write_config_to_file"),  # gcp-storage-emulator's Storage
    ("beam_jobs/convert.py", "_actions"),  # argparse's parser: the flags convert knows
}
PRIVATE = re.compile(r"_[A-Za-z]\w*")


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _own_names() -> set[str]:
    """Every underscore name evenshard defines: functions, classes, variables, attributes
    it assigns, arguments, import aliases."""
    names = set()
    for _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return {n for n in names if n.startswith("_")}


def _named_as_text(tree) -> set[int]:
    """The string constants that name an attribute: getattr/hasattr/setattr's second
    argument, an operand of a comparison (``code.co_name == "_loop"``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "hasattr",
            "setattr",
        ):
            out |= {id(a) for a in node.args[1:2]}
        elif isinstance(node, ast.Compare):
            out |= {id(a) for a in (node.left, *node.comparators)}
    return out


def foreign_private_names(rel: str, tree, own: set[str]) -> list[str]:
    """Where module ``rel`` touches a private name that is not evenshard's own."""
    found = []
    texts = _named_as_text(tree)
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            parts = node.module.split(".")
            if top in LIBRARIES and (
                any(p.startswith("_") for p in parts)
                or node.module.startswith(INTERNAL_PACKAGES)
                or any(a.name.startswith("_") for a in node.names)
            ):
                found.append(f"{rel}:{node.lineno} from {node.module} import ...")
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES and (
                    alias.name.startswith(INTERNAL_PACKAGES) or "._" in alias.name
                ):
                    found.append(f"{rel}:{node.lineno} import {alias.name}")
            continue
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Constant) and id(node) in texts and isinstance(node.value, str):
            name = node.value if PRIVATE.fullmatch(node.value) else None
        if (
            name
            and name.startswith("_")
            and not name.startswith("__")
            and name not in own
            and name not in PUBLIC
            and (rel, name) not in OTHERS
        ):
            found.append(f"{rel}:{node.lineno} {name}")
    return found


@pytest.mark.fast
def test_no_private_name_of_another_library_outside_the_compat_modules():
    own = _own_names() - {n for _, tree in _compat_trees() for n in _defined(tree)}
    found = []
    for rel, tree in _modules():
        if rel not in COMPAT:
            found += foreign_private_names(rel, tree, own)
    assert not found, (
        "private names of other libraries outside the compat modules (move them into "
        "reader/compat/*.py or beam_jobs/compat_beam.py):\n" + "\n".join(found)
    )


def _compat_trees():
    for rel in COMPAT:
        yield rel, ast.parse((ROOT / rel).read_text())


def _defined(tree) -> set[str]:
    return {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id.startswith("_")
    }


@pytest.mark.fast
def test_the_grep_finds_each_kind_of_reach():
    """The grep sees an attribute, a name given as text, a private import and an internal
    package: the four forms the compat modules took out."""
    source = (
        "from multiprocessing import forkserver\n"
        "from apache_beam.runners.dask.overrides import _Reshuffle\n"
        "from tensorflow.python.eager import context\n"
        "x = forkserver._forkserver\n"
        "y = hasattr(it, '_num_yielded')\n"
        "z = name.removesuffix('_list') + '_not_a_name'\n"
    )
    found = foreign_private_names("reader/x.py", ast.parse(source), own={"_list"})
    assert [f.split(" ", 1)[1] for f in found] == [
        "from apache_beam.runners.dask.overrides import ...",
        "from tensorflow.python.eager import ...",
        "_forkserver",
        "_num_yielded",
    ]


@pytest.mark.fast
@pytest.mark.parametrize("module", ["reader.compat.torch", "reader.compat.tf", "reader.compat.mp"])
def test_the_installed_library_still_has_each_private_name(module):
    import importlib

    importlib.import_module(module).check()


@pytest.mark.fast
def test_the_installed_beam_still_has_each_private_name():
    from beam_jobs import compat_beam

    compat_beam.check()


def _beam_inspection():
    """Beam's own ``userstate.get_dofn_specs``, a counter of it, and what it inspected
    (kept alive: no two of them share an id)."""
    from apache_beam.transforms import userstate

    beams = getattr(userstate.get_dofn_specs, "remembers", userstate.get_dofn_specs)
    inspected = []

    def counted(dofn):
        inspected.append(dofn)
        return beams(dofn)

    return beams, counted, inspected


def _stateful_count():
    """A DoFn counting its key's elements in bag state: what Beam must still see."""
    import apache_beam as beam
    from apache_beam.coders import VarIntCoder
    from apache_beam.transforms.userstate import BagStateSpec

    class Count(beam.DoFn):
        SEEN = BagStateSpec("seen", VarIntCoder())

        def process(self, element, seen=beam.DoFn.StateParam(SEEN)):  # noqa: B008 (Beam's way)
            seen.add(1)
            yield element[0], sum(seen.read())

    return Count()


@pytest.mark.fast
def test_beam_inspects_a_dofn_once_and_keeps_only_its_answer():
    import gc
    import weakref

    import apache_beam as beam

    from beam_jobs.compat_beam import remembering

    beams, counted, inspected = _beam_inspection()
    get_dofn_specs = remembering(counted)
    stateful, plain = _stateful_count(), beam.Map(str).fn
    for dofn in (stateful, plain, stateful, plain, stateful):
        states, timers = get_dofn_specs(dofn)
        assert (states, timers) == beams(dofn)
        states.clear()  # each caller's sets are its own
    assert len(get_dofn_specs(stateful)[0]) == 1 and not get_dofn_specs(plain)[0]
    assert inspected == [stateful, plain]
    assert len(get_dofn_specs.kept) == 2
    alive = weakref.ref(stateful)
    del stateful, dofn, inspected[:]
    gc.collect()
    assert alive() is None  # the kept answer does not keep its DoFn, and goes with it
    assert len(get_dofn_specs.kept) == 1


@pytest.mark.fast
def test_beams_inspection_is_wrapped_once_however_often_convert_asks(monkeypatch):
    from apache_beam.transforms import userstate

    from beam_jobs import compat_beam

    beams, _, _ = _beam_inspection()
    monkeypatch.setattr(userstate, "get_dofn_specs", beams)
    compat_beam.remember_dofn_specs()
    compat_beam.remember_dofn_specs()
    assert userstate.get_dofn_specs.remembers is beams
    monkeypatch.delattr(userstate, "get_dofn_specs")
    compat_beam.remember_dofn_specs()  # a Beam without it: left as it is
    assert not hasattr(userstate, "get_dofn_specs")


def test_a_stateful_dofn_runs_on_the_local_runner_with_its_inspection_kept(monkeypatch):
    """With the inspection kept, building, translating and running a pipeline inspects
    each DoFn instance once, and its state still works. (That no Beam module holds
    its own reference to Beam's inspection, which this count cannot see, is
    compat_beam.check's.)"""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms import userstate

    from beam_jobs.compat_beam import remembering

    _, counted, inspected = _beam_inspection()
    monkeypatch.setattr(userstate, "get_dofn_specs", remembering(counted))
    with beam.Pipeline(runner=FnApiRunner()) as p:
        keyed = p | beam.Create([("a", 1), ("b", 2), ("a", 3)]) | beam.Map(lambda kv: kv)
        counts = keyed | beam.ParDo(_stateful_count())
        assert_that(counts, equal_to([("a", 1), ("a", 2), ("b", 1)]))
    assert inspected and len(inspected) == len({id(dofn) for dofn in inspected})


@pytest.mark.fast
def test_a_changed_name_fails_loudly_naming_it_and_the_version(monkeypatch):
    import torch

    from reader.compat import mp as compat_mp
    from reader.compat import torch as compat_torch

    monkeypatch.setattr(compat_torch, "_YIELDED", "_renamed_by_a_release")
    with pytest.raises(RuntimeError, match=f"torch {re.escape(torch.__version__)}.*_renamed"):
        compat_torch.check()
    monkeypatch.setattr(compat_mp, "_PRELOAD", "_gone")
    with pytest.raises(RuntimeError, match=r"Python 3\.\d+.*_forkserver\._gone"):
        compat_mp.check()


def _subclasses_of_the_libraries():
    """(module path, class) of each evenshard class with a base from one of LIBRARIES."""
    import importlib
    import inspect

    for rel, tree in _modules():
        if rel in COMPAT:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.bases:
                module = importlib.import_module(rel[:-3].replace("/", "."))
                cls = getattr(module, node.name, None)
                if inspect.isclass(cls) and any(
                    b.__module__.split(".")[0] in LIBRARIES for b in cls.__mro__[1:]
                ):
                    yield rel, node, cls


@pytest.mark.fast
def test_no_subclass_reaches_into_its_base_s_private_attributes():
    """``self._x`` in a subclass of a library's class is the library's private name when
    the base's source has it (read or set)."""
    import inspect

    found = []
    for rel, node, cls in _subclasses_of_the_libraries():
        bases = []
        for base in cls.__mro__[1:]:
            if base.__module__.split(".")[0] in LIBRARIES:
                try:
                    bases.append(inspect.getsource(base))
                except (OSError, TypeError):  # compiled (Cython): no source
                    continue
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr.startswith("_")
                and not sub.attr.startswith("__")
                and any(re.search(rf"\b{sub.attr}\b", text) for text in bases)
            ):
                found.append(f"{rel}:{sub.lineno} self.{sub.attr} ({cls.__mro__[1].__name__}'s)")
    assert not found, "a base class's private attributes reached into:\n" + "\n".join(found)
