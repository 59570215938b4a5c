"""One error root: every exception class evenshard raises derives from ``Error``, which
each package exports, and keeps its built-in base."""

from __future__ import annotations

import ast
import pathlib

import pytest

import audit
import beam_jobs
import convert_core
import reader
import schemas
from beam_jobs import convert
from beam_jobs.forked_workers import WorkerLost
from convert_core.options import DatasetRefused, UserError
from convert_core.paths import BadPath
from convert_core.record_rules import RecordProblem
from reader.routes.dali_decode import UndecodableError
from reader.routes.preprocess import TransformError
from schemas.errors import (
    InvalidTypeError,
    InvalidValueError,
    MissingFileError,
    OperationError,
    StorageError,
)
from schemas.images import Rejected
from schemas.info import DatasetError
from schemas.tfrecord import CorruptRecord

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "reader", "convert_core", "beam_jobs", "audit", "evenshard")

# each public error class and the built-in base callers caught before the root
ERRORS = {
    DatasetError: ValueError,
    UserError: ValueError,
    BadPath: ValueError,
    CorruptRecord: ValueError,
    DatasetRefused: RuntimeError,
    TransformError: RuntimeError,
    UndecodableError: RuntimeError,  # and a DatasetError: ValueError
    WorkerLost: RuntimeError,
    Rejected: Exception,
    RecordProblem: Exception,
    InvalidValueError: ValueError,
    InvalidTypeError: TypeError,
    OperationError: RuntimeError,
    MissingFileError: FileNotFoundError,
    StorageError: OSError,
}
# raised and caught inside one module, as control flow: never reaches a caller
INTERNAL = {"_TooLarge", "Died"}  # Died: a worker gone, said as OperationError


@pytest.mark.fast
def test_every_package_exports_the_one_root():
    assert schemas.Error is reader.Error is convert_core.Error is beam_jobs.Error is audit.Error
    assert reader.Error.__bases__ == (Exception,)


@pytest.mark.fast
@pytest.mark.parametrize("error", list(ERRORS), ids=lambda e: e.__name__)
def test_each_error_derives_from_the_root_and_keeps_its_old_base(error):
    assert issubclass(error, reader.Error)
    assert issubclass(error, ERRORS[error])


@pytest.mark.fast
def test_every_exception_class_in_the_packages_is_listed_here():
    """A new exception class joins ERRORS (or INTERNAL): the root test then covers it."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    "Error" in ast.unparse(b) or "Exception" in ast.unparse(b) for b in node.bases
                ):
                    found.add(node.name)
    listed = {e.__name__ for e in ERRORS} | INTERNAL | {"_HeaderDamage", "Error"}
    assert found <= listed, f"exception classes not listed in ERRORS: {found - listed}"


@pytest.mark.fast
def test_except_reader_error_catches_a_missing_dataset(tmp_path):
    with pytest.raises(reader.Error) as caught:
        reader.NumpyReader(str(tmp_path / "no-such-dataset"), "train", 2, image_size=(8, 8))
    assert isinstance(caught.value, DatasetError) and isinstance(caught.value, ValueError)
    with pytest.raises(reader.Error):
        reader.load_info(str(tmp_path / "no-such-dataset"))


@pytest.mark.fast
def test_except_beam_jobs_error_catches_a_convert_mistake(tmp_path):
    argv = [f"--input={tmp_path / 'missing'}", f"--output_dir={tmp_path / 'out'}"]
    with pytest.raises(beam_jobs.Error) as caught:
        convert.run(argv)
    assert isinstance(caught.value, UserError)
    assert "\n" not in str(caught.value)


@pytest.mark.fast
def test_no_module_raises_a_bare_built_in_error():
    """Where evenshard raises a built-in kind (ValueError, TypeError, ...), it raises the
    subclass of it under the root, so ``except reader.Error`` catches it too."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bare = re.compile(r"raise (ValueError|TypeError|RuntimeError|FileNotFoundError|OSError)\(")
    found = [
        f"{path.relative_to(root)}:{number}"
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert not found, f"raise the subclass in schemas/errors.py instead: {found}"


@pytest.mark.fast
def test_a_refused_option_is_a_reader_error_and_a_value_error():
    import reader

    with pytest.raises(reader.Error) as caught:
        reader.ReadOptions(image_size=(0, 8))
    assert isinstance(caught.value, ValueError)
