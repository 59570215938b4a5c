"""The folder walk and the input rules on their own: plain Python, no Beam, no pipeline."""

from __future__ import annotations

import os

import pytest

from convert_core import walk
from convert_core.candidates import CandidateRules, rows_of
from convert_core.records import Candidate, Reject

pytestmark = pytest.mark.fast  # the unit lane: make test-fast


def _walk(root: str) -> list[tuple[str, object]]:
    """Both passes, as ReadInputs runs them: each work item, then every link."""
    found, links, unlisted = [], [], []
    for kind, name in walk.listing_work(root):
        found += walk.walk_tree(root, name, links, unlisted, recurse=kind == "tree")
    found += walk.follow_links(root, sorted(links), frozenset(unlisted))
    return [(os.path.relpath(path, root), rejected) for path, rejected in found]


def test_a_walk_lists_each_file_once_and_names_every_alias(tmp_path):
    root = tmp_path / "images"
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        (root / label / "a.png").write_bytes(b"x")
    (root / "dog" / ".hidden.png").write_bytes(b"x")
    (root / "top.txt").write_bytes(b"x")
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"x")
    os.symlink(root / "cat" / "a.png", root / "dog" / "alias.png")  # a second name
    os.symlink(outside, root / "dog" / "outside.png")  # a file outside the tree
    os.symlink(root / "cat", root / "cat_again")  # a folder walked twice
    os.symlink(tmp_path / "gone.png", root / "cat" / "broken.png")
    os.symlink(root / "dog", root / "dog" / "loop")

    same = "the same file as {} (through a symlink)".format
    assert _walk(str(root)) == [
        # pass 1: the real tree, in order; hidden names skipped
        ("top.txt", None),  # an input: the rules reject it (not in a label folder)
        ("cat/a.png", None),
        ("dog/a.png", None),
        ("cat/broken.png", None),  # an input: inspection rejects it as missing
        # pass 2: the links, sorted, each file reached again named as what it is
        ("cat_again/a.png", ("duplicate_file", same(root / "cat" / "a.png"))),
        ("cat_again/broken.png", ("duplicate_file", same(root / "cat" / "broken.png"))),
        ("dog/alias.png", ("duplicate_file", same(root / "cat" / "a.png"))),
        ("dog/loop", ("unreadable", "symlink loop: a link to its own parent folder")),
        ("dog/outside.png", None),  # a file outside the tree: an input
    ]


def test_the_rules_make_a_candidate_or_name_the_reject(tmp_path):
    root = str(tmp_path)
    rules = CandidateRules(root, None, "image", frozenset({"cat"}), group_by=None)
    ok = rules.file(f"{root}/cat/a.png")
    assert isinstance(ok, Candidate) and (ok.key, ok.label) == ("cat/a.png", "cat")
    for source, reason in [
        (f"{root}/cat/a.txt", "unsupported_format"),
        (f"{root}/a.png", "bad_label"),
        (f"{root}/dog/a.png", "bad_label"),  # not in the vocabulary
    ]:
        got = rules.file(source)
        assert isinstance(got, Reject) and got.reason == reason, source

    manifest = tmp_path / "m.csv"
    manifest.write_text("path,label,split\ncat/a.png,cat,train\n\n../x.png,cat,\nb.png,,\nc.png\n")
    with open(manifest, newline="") as f:
        rows = [rules.row(n, row) for n, row in rows_of(str(manifest), f)]
    assert isinstance(rows[0], Candidate) and (rows[0].split, rows[0].row) == ("train", 2)
    assert [r.reason for r in rows[1:]] == ["bad_path", "bad_label", "malformed_row"]
