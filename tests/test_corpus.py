"""The bad-input corpus: every odd file is accepted with the right metadata or rejected
with the right reason; the job never crashes; counts reconcile; the reader decodes
every accepted record."""

from __future__ import annotations

import os

import corpus
import pytest
from conftest import read_rejects, read_split, run_convert

import reader


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("corpus") / "images")
    return root, corpus.build_folder(root)


@pytest.fixture(scope="module")
def converted(folder, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("corpus_out"))
    return run_convert(folder[0], out, "--splits=all=1.0", "--max_reject_fraction=1"), out


def test_every_odd_file_is_accepted_or_rejected_with_its_reason(folder, converted):
    _, expected = folder
    info, out = converted
    rejected = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert rejected == {k: e[1] for k, e in expected.items() if e[0] == "reject"}
    records = {r["image/key"].decode(): r for r in read_split(out, "all")[0]}
    accepted = {k: e for k, e in expected.items() if e[0] == "accept"}
    assert set(records) == set(accepted)
    for key, (_, fmt, height, width, channels) in accepted.items():
        r = records[key]
        got = (r["image/format"].decode(), r["image/height"], r["image/width"], r["image/channels"])
        assert got == (fmt, height, width, channels), key
    assert info["inputs"] == len(expected) == len(records) + info["rejects"]["total"]


def test_validate_full_decodes_every_accepted_record_as_the_reader_does(converted):
    from audit.validate import validate

    assert validate(converted[1], full=True) == []


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_the_reader_decodes_every_accepted_record(folder, converted, channels):
    _, out = converted
    ds = reader.make_dataset(out, "all", batch_size=None, shuffle=False, channels=channels)
    shapes = {ex["key"].numpy().decode(): tuple(ex["image"].shape) for ex in ds}
    accepted = {k: e for k, e in folder[1].items() if e[0] == "accept"}
    # stored orientation: EXIF rotation is not applied (docs/convert.md)
    assert shapes == {k: (e[2], e[3], channels) for k, e in accepted.items()}


def test_manifest_corpus(folder, tmp_path):
    """BOM + CRLF, a blank line, a duplicate key, a path escaping the root, a label
    outside --labels, a malformed row."""
    root, _ = folder
    manifest = os.path.join(os.path.dirname(root), "manifest.csv")
    expected = corpus.build_manifest(root, manifest)
    vocab = tmp_path / "labels.txt"
    vocab.write_text("odd\n")
    out = str(tmp_path / "out")
    info = run_convert(
        manifest, out, "--splits=all=1.0", "--max_reject_fraction=1", f"--labels={vocab}"
    )
    rejected = sorted((r["key"], r["reason"]) for r in read_rejects(out))
    assert rejected == sorted((k.strip(), v) for k, v in expected.items() if v != "accept")
    keys = sorted(r["image/key"].decode() for r in read_split(out, "all")[0])
    assert keys == sorted(k for k, v in expected.items() if v == "accept")
    assert info["inputs"] == 7 == len(keys) + info["rejects"]["total"]
