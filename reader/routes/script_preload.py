"""The training script's own imports, made once in the fork server the Python route's
processes fork from (``reader.routes.preprocess``), not once a process.

Each process of a read with a transform runs the script's top again (as
``__mp_main__``, where ``if __name__ == "__main__":`` is false: the transform may be
defined there), and with it ``import torch`` or ``import tensorflow``: some 5 CPU-s a
process, a read's processes at once, every read. Python
3.13 preloads the script in the server itself (its ``__main__`` preload never worked
before: cpython gh-126631); before, the server imports what the script imports at its
top, and each process finds it done.

The server is not the script: it starts with ``python -c`` in the current folder (the
script's folder is not on its path) and with ``sys.argv == ["-c"]``. So a module is
preloaded only where the server finds the very file this process imported
(``script_imports``: a ``helpers.py`` beside the script, or one the current folder
shadows, is left to the processes), and the server imports them through this module
(it is on the server's preload list), which ignores any error: multiprocessing ignores
an ImportError alone, and any other error (a module that reads ``sys.argv``) would end
the server and fail every read. What fails there is imported by each process, as before.

A script those processes cannot import (read on stdin, or doing its work at its top
level, which each process would do again) is said in one line before any starts
(``unimportable_script``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import sys

# the modules the fork server imports as it starts (set only while it starts)
VARIABLE = "EVENSHARD_SCRIPT_IMPORTS"


def script_imports() -> list[str]:
    """The modules the training script (``__main__``, a .py file) imports at its top
    level (and in a top-level ``try:``), among those this process imported, that the
    fork server finds where this process found them; [] on Python 3.13 and later."""
    if sys.version_info >= (3, 13):
        return []
    tree = _script_tree()
    if tree is None:
        return []  # no script (python -c, a REPL, a notebook), or not Python source
    names: list[str] = []
    statements = list(tree.body)
    while statements:  # the top level, and the try blocks there (an optional import)
        node = statements.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Try):
            statements[:0] = node.body
    return [name for name in dict.fromkeys(names) if name in sys.modules and _found_alike(name)]


def _script_tree() -> ast.Module | None:
    """The training script's source parsed; None without one (python -c, a REPL, a
    notebook, stdin) or when it is not Python source."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        with open(path, "rb") as f:
            return ast.parse(f.read())
    except (TypeError, OSError, SyntaxError, ValueError):
        return None


def unimportable_script() -> str | None:
    """Why processes that import the training script, as multiprocessing's do, cannot:
    it was read on stdin (they find no file), or it has no ``if __name__ ==
    "__main__":`` (each would run its top level again, and with it the read that
    starts them); None where they can, or there is no script to import."""
    main = sys.modules.get("__main__")
    path, spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    # what multiprocessing does not import: an IPython shell, a package's __main__.py
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    if spec is not None and spec.name.rpartition(".")[2] == "__main__":
        return None
    if not os.path.isfile(path):
        return f"the script was read from {path}, not a file"
    tree = _script_tree()
    if tree is None or any(
        isinstance(node, ast.If)
        and any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test))
        for node in tree.body
    ):
        return None
    return f"{path} does its work at its top level, which each would run again"


def _found_alike(name: str) -> bool:
    """Whether the fork server's path (the current folder first, not the script's)
    finds the package of ``name`` at the file this process imported."""
    top = name.partition(".")[0]
    origin = getattr(getattr(sys.modules.get(top), "__spec__", None), "origin", None)
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]])
    return origin is not None and spec is not None and spec.origin == origin


def start_server(names: list[str]) -> None:
    """Starts the fork server now, importing ``names`` there (nothing when it runs
    already: a server is one a process, and keeps what it imported at its start)."""
    from multiprocessing import forkserver

    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = ",".join(names)
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before


def _import_named() -> None:
    """In the fork server: the modules ``start_server`` named, each error ignored."""
    for name in filter(None, os.environ.get(VARIABLE, "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001, S110 - the server must live; each process imports it
            pass


_import_named()
