"""A manifest input is a file and a group is a unit: neither lands in two splits."""

from __future__ import annotations

import csv
import os

import numpy as np
from conftest import read_rejects, read_split, run_convert

from evenshard import synthetic


def _png(path, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(synthetic.image_bytes("png", 8, 8, np.random.default_rng(seed)))


def _manifest(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def _written(out):
    import schemas

    info = schemas.load_info(str(out))
    return {
        r["image/key"].decode(): (split, r["image/class/text"].decode())
        for split in info["splits"]
        for shard in read_split(str(out), split)
        for r in shard
    }, info


def test_one_file_under_two_spellings_is_one_input(tmp_path):
    for i in range(6):
        _png(tmp_path / "img" / "x" / f"{i}.png", i)
    os.symlink(tmp_path / "img" / "x", tmp_path / "linkx")
    rows = [(f"img/x/{i}.png", "x") for i in range(6)]
    rows += [
        (str(tmp_path / "img" / "x" / "0.png"), "y"),  # absolute spelling, another label
        ("linkx/2.png", "y"),  # through a symlinked folder
        ("img/../img/x/3.png", "y"),  # normalized to the key img/x/3.png: duplicate_key
    ]
    manifest = _manifest(tmp_path / "m.csv", ["path", "label"], rows)
    info = run_convert(manifest, str(tmp_path / "out"), "--max_reject_fraction=1")
    written, _ = _written(tmp_path / "out")
    assert len(written) == 6 and {label for _, label in written.values()} == {"x"}
    rejects = sorted((r["reason"], r["detail"]) for r in read_rejects(str(tmp_path / "out")))
    assert rejects == [
        ("duplicate_file", "row 8: the same file as row 2 (key img/x/0.png)"),
        ("duplicate_file", "row 9: the same file as row 4 (key img/x/2.png)"),
        ("duplicate_key", "row 10: key also at row 5"),
    ]
    assert info["inputs"] == 9 and info["rejects"]["total"] == 3
    assert info["rejects"]["by_reason"] == {"duplicate_file": 2, "duplicate_key": 1}


def test_a_group_never_spans_two_splits_whatever_the_split_column_says(tmp_path):
    rows = []
    for g in range(10):
        for i in range(4):
            _png(tmp_path / f"g{g}_{i}.png", g * 4 + i)
            split = "train" if i == 0 else ""  # only the first row of each group says
            rows.append((f"g{g}_{i}.png", f"l{i % 2}", f"g{g}", split))
    # a contradiction: group g9's rows give train and test
    rows[-1] = (*rows[-1][:3], "test")
    manifest = _manifest(tmp_path / "m.csv", ["path", "label", "patient", "split"], rows)
    info = run_convert(
        manifest, str(tmp_path / "out"), "--group_by=patient", "--max_reject_fraction=1"
    )
    written, _ = _written(tmp_path / "out")
    assert {split for split, _ in written.values()} == {"train"}
    assert len(written) == 36
    rejects = read_rejects(str(tmp_path / "out"))
    assert sorted(r["key"] for r in rejects) == [f"g9_{i}.png" for i in range(4)]
    assert {r["reason"] for r in rejects} == {"bad_split"}
    assert "group 'g9' is given splits test, train" in rejects[0]["detail"]
    assert info["inputs"] == 40
