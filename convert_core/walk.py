"""The walk of a local image folder, in two passes, with plain ``os`` calls (no Beam).

Pass 1 (``walk_tree``) lists the real tree of one label folder without
following symlinks, so the label folders can be walked in parallel; pass 2
(``follow_links``) follows every symlink they hold, in one place, so a file
reached twice (through a link and directly, or through two links) is one
input and one ``duplicate_file`` reject, never two inputs. Each yields
``(path, None)`` for an input and ``(path, (reason, detail))`` for a reject.

Local folders are walked here rather than with Beam's ``FileSystems.match``,
whose local listing silently drops files it cannot stat (broken symlinks,
symlink loops): those must become rejects, not vanish.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from convert_core import paths


class Links(NamedTuple):
    """What pass 1 of a folder walk leaves to pass 2: symlinks (paths) and the
    folders it could not list (paths relative to the root)."""

    links: tuple
    unlisted: tuple


def listing_work(root: str) -> list[tuple[str, str]]:
    """The work items of listing an image folder, walked in parallel.

    Local: ("top", "") for the root's own entries, ("tree", name) for each
    visible real sub-folder (a label). A URL: one ("url", "") item.
    """
    if paths.is_url(root):
        return [("url", "")]
    with os.scandir(root) as it:
        folders = [e.name for e in it if not e.name.startswith(".") and _is_folder(e)]
    return [("top", ""), *(("tree", name) for name in sorted(folders))]


def visible(names: list[str]) -> list[str]:
    return sorted(n for n in names if not n.startswith("."))


def walk_tree(root: str, name: str, links: list[str], unlisted: list[str], recurse: bool):
    """Pass 1 of a folder walk: the real tree, symlinks not followed.

    ``name``: a sub-folder of root ("" for root itself); ``recurse`` False
    lists root's own entries only. Files are inputs; symlinks are appended to
    ``links`` and folders that cannot be listed (one ``unreadable`` reject
    each) to ``unlisted``, for pass 2.
    """
    start = f"{root}/{name}" if name else root
    for path, rel, error in _real_files(start, links, name, recurse):
        if error is not None:  # a folder that cannot be listed: its files are unknown
            unlisted.append(rel)
            yield path, ("unreadable", f"folder cannot be listed ({error})")
        else:
            yield path, None


def follow_links(root: str, links: list[str], unlisted: frozenset[str]):
    """Pass 2: follows the symlinks (to files and folders), level by level, each
    level sorted.

    A file whose real path pass 1 listed is an alias (``a_alias -> real_b``
    yields real_b's files as ``duplicate_file`` rejects, so they are neither
    lost nor written twice); a file outside the tree is an input. A folder
    link to its own ancestor is one ``unreadable`` reject (a loop), a second
    link to a folder already walked one ``duplicate_file``. Broken symlinks
    are inputs, for inspection to reject as missing or unreadable. Pass 1's
    files are recognised by their real path (``_listed_by_pass_1``), so the
    label folders can be walked apart; this pass keeps only what it reaches.
    """
    real_root = os.path.realpath(root)

    def first_listed(real: str) -> str | None:
        return _listed_by_pass_1(root, real_root, real, unlisted)

    listed: dict[str, str] = {}  # real path -> the link path it was listed under
    walked: dict[str, str] = {}  # real folder -> the link it was walked through
    while links:
        nested: list[str] = []
        for link in sorted(links):
            if not os.path.isdir(link):  # a file link, broken, or a loop of file links
                yield link, _alias(link, listed, first_listed)
                continue
            real = os.path.realpath(link)
            parent = os.path.realpath(os.path.dirname(link))
            if parent == real or parent.startswith(real + "/"):
                yield link, ("unreadable", "symlink loop: a link to its own parent folder")
                continue
            if real in walked:
                yield link, ("duplicate_file", f"links to the folder of {walked[real]}")
                continue
            walked[real] = link
            for dirpath, dirnames, filenames in os.walk(link):
                names = visible(dirnames)
                for d in names:
                    if os.path.islink(os.path.join(dirpath, d)):
                        nested.append(os.path.join(dirpath, d))
                dirnames[:] = [d for d in names if not os.path.islink(os.path.join(dirpath, d))]
                for name in visible(filenames):
                    path = os.path.join(dirpath, name)
                    yield path, _alias(path, listed, first_listed)
        links = nested


def _listed_by_pass_1(root: str, real_root: str, real: str, unlisted: frozenset) -> str | None:
    """The path pass 1 listed a real path under, or None if it did not list it.

    Pass 1 lists every visible entry that is not a folder, reached from the
    root through visible real folders it could list. So a real path was
    listed exactly when it lies under the root's real path, no part of it is
    hidden or a symlink (only a loop leaves one in), no folder above it is in
    ``unlisted``, and it exists and is not a folder.
    """
    rel = paths.relative_to(real_root, real)
    if rel is None:
        return None
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return None
    if any("/".join(parts[:i]) in unlisted for i in range(1, len(parts))):
        return None
    if not os.path.lexists(real) or os.path.isdir(real):
        return None
    # a symlink loop has no real path: realpath leaves links in it
    if any(os.path.islink(f"{real_root}/{'/'.join(parts[:i])}") for i in range(1, len(parts) + 1)):
        return None
    return f"{root}/{rel}"


def _real_files(root: str, links: list[str], prefix: str = "", recurse: bool = True):
    """Pass 1: (path, path relative to root, None) of every file under root that
    is not a symlink, without following symlinks (each is appended to
    ``links``); (folder, its relative path, the error) for a sub-folder that
    cannot be listed (``os.walk`` would skip it, and its files with it).

    Top-down like ``os.walk`` (a folder's files sorted, then its sub-folders
    sorted), hidden names skipped; ``os.scandir`` tells links and folders
    apart without a stat a file. The root itself must list: its error raises.
    ``prefix``: root's own path relative to the walk's root; ``recurse``
    False: root's own entries only, sub-folders not entered.
    """
    stack = [(root, prefix)]
    while stack:
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=_name)
        except OSError as e:
            if not rel:  # the input folder itself
                raise
            yield folder, rel, f"{type(e).__name__}: {e.strerror or e}"
            continue
        folders = []
        for e in entries:
            if e.is_symlink():
                links.append(e.path)
            elif _is_folder(e):
                if recurse:
                    folders.append((e.path, f"{rel}/{e.name}" if rel else e.name))
            else:
                yield e.path, f"{rel}/{e.name}" if rel else e.name, None
        stack.extend(reversed(folders))


def _name(entry) -> str:
    return entry.name


def _is_folder(entry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _alias(path: str, listed: dict[str, str], first_listed) -> tuple[str, str] | None:
    """None for a file seen for the first time (now listed); else why it is a reject.

    ``first_listed(real)``: where pass 1 listed a real path, or None.
    """
    real = os.path.realpath(path)
    seen = first_listed(real) or listed.get(real)
    if seen:
        return "duplicate_file", f"the same file as {seen} (through a symlink)"
    listed[real] = path
    return None
