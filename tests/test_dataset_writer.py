"""The Beam-free fixture writer (tests/dataset_writer.py) writes what convert writes.

The reader tests build their datasets with ``write_dataset``; these tests are
why they may: for each option it takes, a real Beam convert of the same input
writes the same files, byte for byte (shards, DALI indexes, rejects,
schema, labels, the marker and ``dataset_info.json``).
"""

from __future__ import annotations

import os

import pytest
from conftest import files_of, run_convert, write_manifest
from dataset_writer import write_dataset

from convert_core.options import DatasetRefused
from evenshard import synthetic


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """An image folder of every format with broken files, and manifests of it: one with
    keys, a split column and a repeated key; one of paths for path records."""
    root = tmp_path_factory.mktemp("writer")
    images = root / "images"
    synthetic.make_image_folder(
        str(images),
        num_labels=3,
        per_label=12,
        formats=("png", "jpeg", "gif", "bmp", "webp"),
        broken=True,
    )
    files = sorted(
        f"{label}/{name}"
        for label in os.listdir(images)
        if (images / label).is_dir()
        for name in os.listdir(images / label)
    )
    rows = [
        {"path": f"images/{f}", "label": f.split("/")[0], "key": f"k{i:03d}", "split": ""}
        for i, f in enumerate(files)
    ]
    rows[0]["split"] = rows[1]["split"] = "holdout"  # a split the row gives wins
    rows.append({**rows[5], "path": f"images/{files[6]}"})  # k005 again: duplicate_key
    write_manifest(str(root / "keyed.csv"), rows, ["path", "label", "key", "split"])
    write_manifest(str(root / "paths.csv"), rows[:-1], ["path", "label"])
    labels = sorted({f.split("/")[0] for f in files}) + ["unused"]
    (root / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    return root


CASES = {
    "folder, hash splits, shards by examples": (
        "images",
        "--splits=train=0.7,val=0.3",
        "--examples_per_shard=4",
    ),
    "folder, exact splits, label balance, gzip": (
        "images",
        "--splits=train=0.5,val=0.5",
        "--split_mode=exact",
        "--balance=label",
        "--num_shards=2",
        "--compression=gzip",
        "--seed=3",
        "--split_seed=5",
    ),
    "manifest: keys, a given split, a repeated key, --labels, shards by size": (
        "keyed.csv",
        "--labels={root}/labels.txt",
        "--target_shard_mb=0.01",
        "--shard_multiple=2",
    ),
    "manifest, path records, verify header": (
        "paths.csv",
        "--splits=train=1.0",
        "--record_kind=path",
        "--verify=header",
        "--num_shards=4",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_writer_writes_the_bytes_convert_writes(inputs, tmp_path, case):
    source, *flags = CASES[case]
    flags = [f.format(root=inputs) for f in flags] + ["--max_reject_fraction=0.5"]
    beam = run_convert(str(inputs / source), str(tmp_path / "beam"), *flags, validated=False)
    fast = write_dataset(str(inputs / source), str(tmp_path / "fast"), *flags)
    written, expected = files_of(tmp_path / "fast"), files_of(tmp_path / "beam")
    assert sorted(written) == sorted(expected)
    assert [n for n in expected if written[n] != expected[n]] == []
    beam.pop("runner")
    assert fast == beam
    assert fast["rejects"]["total"] > 0  # the rejects file is compared too


# The option sets the reader tests give write_dataset most (beside CASES), on the
# folder of every format with broken files: what run_convert checked on each fixture.
READER_CASES = {
    "one split, 4 shards": ("--splits=train=1.0", "--num_shards=4"),
    "one split, 2 shards, gzip": ("--splits=train=1.0", "--num_shards=2", "--compression=gzip"),
    "path records": ("--splits=train=1.0", "--num_shards=2", "--record_kind=path"),
    "path records, gzip": ("--num_shards=2", "--record_kind=path", "--compression=gzip"),
    "eval only, 3 shards": ("--splits=eval=1.0", "--num_shards=3"),
    "train and val, 6 shards": ("--splits=train=0.8,val=0.2", "--num_shards=6"),
    "exact halves": ("--splits=train=0.5,eval=0.5", "--split_mode=exact"),
    "default splits and shards": (),
    "more shards than records": ("--splits=train=1.0", "--num_shards=60"),
}


@pytest.mark.parametrize(
    "case",
    [*CASES.values(), *(("images", *flags) for flags in READER_CASES.values())],
    ids=[*CASES, *READER_CASES],
)
def test_the_writer_writes_what_validate_full_finds_nothing_in(inputs, tmp_path, case):
    """``run_convert`` asserted ``validate --full`` finds nothing in each fixture it
    wrote; ``write_dataset`` does not, so its option sets are checked here. With
    ``--verify=header`` a cut image's body passes convert (docs/convert.md), and is what
    ``--full`` finds."""
    from audit.validate import validate

    source, *flags = case
    flags = [f.format(root=inputs) for f in flags] + ["--max_reject_fraction=0.5"]
    out = str(tmp_path / "out")
    info = write_dataset(str(inputs / source), out, *flags)
    assert info["rejects"]["total"] > 0  # the broken files are in every one
    findings = validate(out, full=True)
    if "--verify=header" in flags:  # a cut body passes a header check (convert.md): --full
        cut = "does not decode by convert's rules (truncated)"
        assert findings and all(cut in f for f in findings)
    else:
        assert findings == []


@pytest.mark.fast
def test_the_writer_refuses_what_it_does_not_do(inputs, tmp_path):
    images = str(inputs / "images")
    for flags, what in [
        (["--dedupe=content"], "--dedupe=content"),
        (["--runner=DirectRunner"], "Beam's flags"),
    ]:
        with pytest.raises(ValueError, match=what):
            write_dataset(images, str(tmp_path / "out"), *flags)
    with pytest.raises(DatasetRefused, match="--max_reject_fraction"):  # as convert refuses
        write_dataset(images, str(tmp_path / "out"))  # the broken files are over 5 %
