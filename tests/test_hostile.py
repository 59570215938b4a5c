"""Hostile inputs: nothing hangs, nothing is lost, no user file is touched, no split leaks."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import threading

import numpy as np
import pytest
from conftest import load_info, read_rejects, run_convert
from dataset_writer import write_dataset

import reader
from audit.validate import validate
from convert_core.options import UserError
from evenshard import cli, synthetic
from schemas import layout


def _pngs(folder, names, seed=0):
    rng = np.random.default_rng(seed)
    for name in names:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(synthetic.image_bytes("png", 12, 12, rng))


def _manifest(path, rows):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        if ".csv" in os.path.basename(path):
            w = csv.writer(f)
            w.writerow(["path", "label"])
            w.writerows(rows)
        else:
            f.writelines(json.dumps({"path": p, "label": label}) + "\n" for p, label in rows)
    return path


def _accounted(info):
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert info["inputs"] == written + info["rejects"]["total"]
    return written


def _let_a_reader_of_the_fifo_go(fifo, hung: list) -> None:
    """Opens ``fifo`` for writing and closes it: a reader waiting in its open or its
    read goes on, at end of file (nothing happens without a reader)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader: ENXIO
        return
    hung.append(fifo)


def test_fifo_device_and_huge_sparse_file_are_rejected_without_reading(tmp_path):
    root = tmp_path / "images"
    _pngs(root, [f"a/{i}.png" for i in range(4)])
    os.mkfifo(root / "a" / "pipe.jpg")  # in the folder walk too
    with open(root / "a" / "huge.jpg", "wb") as f:
        f.truncate(8 * 2**30)  # 8 GB, sparse: costs nothing on disk
    manifest = _manifest(
        str(root / "m.csv"),
        [(f"a/{i}.png", "a") for i in range(4)]
        + [("a/pipe.jpg", "a"), ("/dev/zero", "a"), ("a/huge.jpg", "a")],
    )
    for source, out in ((manifest, tmp_path / "from_manifest"), (root, tmp_path / "from_folder")):
        # in this process (it was an `evenshard convert` process, ~3 CPU-s a start): a
        # convert that opened the FIFO would wait there for a writer; after 300 s one
        # comes and goes (end of file), and the test fails, as the process's timeout did
        hung = []
        watchdog = threading.Timer(
            300, _let_a_reader_of_the_fifo_go, (root / "a" / "pipe.jpg", hung)
        )
        watchdog.start()
        try:
            run_convert(str(source), str(out), "--max_reject_fraction=1", "--verify=header")
        finally:
            watchdog.cancel()
        assert not hung, f"convert waited on the FIFO for 300 s ({source})"
        reasons = {os.path.basename(r["key"]): r["reason"] for r in read_rejects(str(out))}
        assert reasons["pipe.jpg"] == "unreadable" and reasons["huge.jpg"] == "too_large"
        assert _accounted(load_info(str(out))) == 4
    assert reasons.get("m.csv") == "unsupported_format"  # the folder run lists the manifest
    manifest_rejects = {r["key"]: r for r in read_rejects(str(tmp_path / "from_manifest"))}
    assert manifest_rejects["/dev/zero"]["reason"] == "unreadable"
    assert "FIFO, device or socket" in manifest_rejects["/dev/zero"]["detail"]


@pytest.mark.parametrize("name", ["m.csv.gz", "m.jsonl.gz", "data.csv.d/m.jsonl"])
def test_compressed_manifests_and_the_format_by_suffix(tmp_path, name):
    _pngs(tmp_path, [f"img/{i}.png" for i in range(6)])
    os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
    prefix = "../" if "/" in name else ""
    rows = [(f"{prefix}img/{i}.png", "ab"[i % 2]) for i in range(6)]
    if prefix:  # a manifest may not reach above its folder: keep the images beside it
        _pngs(tmp_path / "data.csv.d", [f"img/{i}.png" for i in range(6)])
        rows = [(f"img/{i}.png", "ab"[i % 2]) for i in range(6)]
    info = run_convert(_manifest(str(tmp_path / name), rows), str(tmp_path / "out"))
    assert _accounted(info) == 6 and info["rejects"]["total"] == 0


def test_flag_abbreviations_are_errors(tmp_path, capsys):
    _pngs(tmp_path / "images", ["a/0.png"])
    argv = ["convert", f"--input={tmp_path / 'images'}", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert "--output_dir" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_spellings_of_one_path_are_one_key(tmp_path):
    _pngs(tmp_path, ["sub/x.png", "y.png", "z.png"])
    rows = [("x.png", "a"), ("./x.png", "a"), ("sub/../x.png", "a"), ("y.png", "a")]
    rows += [("z.png", "b")]
    os.replace(tmp_path / "sub" / "x.png", tmp_path / "x.png")
    manifest = _manifest(str(tmp_path / "m.csv"), rows)
    info = run_convert(manifest, str(tmp_path / "out"), "--max_reject_fraction=1")
    assert _accounted(info) == 3
    dupes = [r for r in read_rejects(str(tmp_path / "out")) if r["reason"] == "duplicate_key"]
    assert [r["key"] for r in dupes] == ["x.png", "x.png"]


def test_an_output_folder_holding_the_inputs_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    _pngs(tmp_path, ["img/0.png", "img/1.png"])
    labels = tmp_path / layout.LABELS_FILE
    labels.write_text("a\n")
    manifest = _manifest(str(tmp_path / "m.csv"), [("img/0.png", "a"), ("img/1.png", "a")])
    (tmp_path / layout.SCHEMA_FILE).write_text("mine")
    argv = ["convert", f"--input={manifest}", f"--output_dir={tmp_path}", f"--labels={labels}"]
    assert cli.main(argv) == 2
    assert "holds the --input file" in capsys.readouterr().err
    assert labels.read_text() == "a\n" and (tmp_path / layout.SCHEMA_FILE).read_text() == "mine"
    # a folder of the user's with files of convert's names is not emptied either
    out = tmp_path / "out"
    out.mkdir()
    (out / layout.LABELS_FILE).write_text("mine")
    with pytest.raises(UserError, match="holds files that evenshard did not write"):
        run_convert(manifest, str(out))
    assert (out / layout.LABELS_FILE).read_text() == "mine"


def test_output_folder_checks_come_before_any_work(tmp_path):
    _pngs(tmp_path / "images", ["a/0.png"])
    (tmp_path / "file").write_text("")
    os.symlink(tmp_path / "images" / "a", tmp_path / "link_into_input")
    cases = {
        str(tmp_path / "file"): "is a file",
        "/proc/evenshard_out": "cannot be written",
        str(tmp_path / "link_into_input"): "lies inside the input folder",
    }
    for out, message in cases.items():
        with pytest.raises(UserError, match=message):
            run_convert(str(tmp_path / "images"), out)


def test_a_second_convert_into_a_locked_folder_is_refused_and_a_stale_lock_taken(tmp_path):
    _pngs(tmp_path / "images", ["a/0.png", "a/1.png"])
    out = tmp_path / "out"
    out.mkdir()
    lock = out / layout.LOCK_FILE
    import socket

    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    with pytest.raises(UserError, match="being written by another convert"):
        run_convert(str(tmp_path / "images"), str(out))
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    info = run_convert(str(tmp_path / "images"), str(out))
    assert _accounted(info) == 2 and not lock.exists()


def test_a_symlink_in_the_manifest_folder_cannot_let_outside_files_in(tmp_path):
    _pngs(tmp_path / "outside", ["secret.png"])
    _pngs(tmp_path / "ds", ["img/0.png"])
    os.symlink(tmp_path / "outside", tmp_path / "ds" / "escape")
    rows = [("img/0.png", "a"), ("escape/secret.png", "a")]
    manifest = _manifest(str(tmp_path / "ds" / "m.csv"), rows)
    info = run_convert(manifest, str(tmp_path / "out"), "--max_reject_fraction=1")
    assert _accounted(info) == 1
    (r,) = read_rejects(str(tmp_path / "out"))
    assert r["reason"] == "bad_path" and "through a symlink" in r["detail"]


def test_symlinked_folders_aliases_and_loops_are_all_accounted_for(tmp_path):
    root = tmp_path / "images"
    _pngs(root, [f"real_b/{i}.png" for i in range(5)] + [f"a/{i}.png" for i in range(5)])
    _pngs(tmp_path / "elsewhere", [f"{i}.png" for i in range(3)], seed=1)
    os.symlink("real_b", root / "a_alias")  # an alias of a sibling: sorts first
    os.symlink(tmp_path / "elsewhere", root / "c_linked")  # outside data, linked in
    os.symlink("..", root / "a" / "up")  # a loop
    os.symlink("0.png", root / "a" / "same.png")  # a file alias
    info = run_convert(str(root), str(tmp_path / "out"), "--max_reject_fraction=1")
    assert _accounted(info) == 13  # real_b 5, a 5, c_linked 3
    counts = {label: 0 for label in info["labels"]}
    for s in info["splits"].values():
        for label, n in s["label_counts"].items():
            counts[label] += n
    assert counts == {"a": 5, "c_linked": 3, "real_b": 5}
    rejects = {r["key"]: r["reason"] for r in read_rejects(str(tmp_path / "out"))}
    aliases = {f"a_alias/{i}.png" for i in range(5)} | {"a/same.png"}
    assert rejects == {**dict.fromkeys(aliases, "duplicate_file"), "a/up": "unreadable"}


def test_a_folder_that_cannot_be_listed_is_a_reject_not_a_silent_loss(tmp_path, monkeypatch):
    """os.walk skips a folder it cannot list, and its files with it; convert names
    the folder. (Root reads any folder, so the listing error is raised here on
    purpose; the in-memory runner runs the walk in this process.)"""
    root = tmp_path / "images"
    names = [f"a/{i}.png" for i in range(4)] + [f"b/deep/{i}.png" for i in range(3)]
    _pngs(root, names + ["c/0.png"])
    locked = {str(root / "b" / "deep"), str(root / "c")}  # deep down, and a label
    scandir = os.scandir

    def refusing(path="."):
        if not isinstance(path, int) and os.fspath(path) in locked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    info = run_convert(str(root), str(tmp_path / "out"), "--max_reject_fraction=1")
    rejects = read_rejects(str(tmp_path / "out"))
    assert [(r["key"], r["reason"]) for r in rejects] == [
        ("b/deep", "unreadable"),
        ("c", "unreadable"),
    ]
    assert all("cannot be listed" in r["detail"] for r in rejects)
    assert _accounted(info) == 4 and info["inputs"] == 6  # 4 images and 2 folders


def test_the_reader_and_validate_refuse_shards_outside_the_folder(tmp_path):
    _pngs(tmp_path / "images", [f"a/{i}.png" for i in range(4)])
    out = str(tmp_path / "out")
    info = write_dataset(str(tmp_path / "images"), out, "--splits=train=1.0")
    shard = info["splits"]["train"]["shards"][0]
    os.makedirs(tmp_path / "other")
    os.replace(os.path.join(out, shard["file"]), tmp_path / "other" / shard["file"])
    shard["file"] = f"../other/{shard['file']}"
    with open(os.path.join(out, layout.INFO_FILE), "w") as f:
        json.dump(info, f)
    with pytest.raises(reader.DatasetError, match="not a plain shard file name"):
        reader.make_dataset(out, "train")
    assert "not a plain shard file name" in validate(out)[0]


def _jsonl(path, lines):
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.writelines(line + "\n" for line in lines)
    return str(path)


def test_bad_jsonl_rows_are_rejects_not_tracebacks(tmp_path):
    _pngs(tmp_path, [f"img/{i}.png" for i in range(8)])
    good = [json.dumps({"path": f"img/{i}.png", "label": "ab"[i % 2]}) for i in range(2, 8)]
    lines = [
        "[1, 2]",  # the first line is not an object: that row only
        json.dumps({"path": "img/0.png", "label": True}),
        json.dumps({"path": "img/1.png", "label": {"a": 1}}),
        '{"path": "img/1.png", "label": NaN, "key": "nan"}',
        json.dumps({"path": "img/1.png", "label": "a", "key": "\ud800"}),
        json.dumps({"path": "img/1.png", "label": "\udcff", "key": "surrogate_label"}),
        *good,
    ]
    out = str(tmp_path / "out")
    info = run_convert(_jsonl(tmp_path / "m.jsonl", lines), out, "--max_reject_fraction=1")
    assert _accounted(info) == 6 and info["labels"] == ["a", "b"]
    reasons = sorted(r["reason"] for r in read_rejects(out))
    assert reasons == ["bad_label"] * 4 + ["bad_path", "malformed_row"]


def test_urls_without_a_bucket_or_an_object_are_bad_path_rejects(tmp_path):
    """A row such as gs:///x.jpg crashed the storage client's bucket-name check."""
    _pngs(tmp_path, [f"img/{i}.png" for i in range(4)])
    odd = ["gs:///x.jpg", "s3:///x.jpg", "gs://", "s3://", "gs://bucket", "s3://bucket/"]
    rows = [(url, "a") for url in odd] + [(f"img/{i}.png", "ab"[i % 2]) for i in range(4)]
    out = str(tmp_path / "out")
    info = run_convert(_manifest(str(tmp_path / "m.csv"), rows), out, "--max_reject_fraction=1")
    assert _accounted(info) == 4
    rejects = read_rejects(out)
    assert [r["reason"] for r in rejects] == ["bad_path"] * len(odd)
    details = " ".join(r["detail"] for r in rejects)
    assert "names no bucket" in details and "names no object" in details


def test_one_line_errors_naming_the_fix(tmp_path, capsys):
    _pngs(tmp_path, ["img/a/0.png", "img/a/1.png"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "folder.csv").mkdir()
    (tmp_path / "header_only.csv").write_text("path,label\n\n")
    (tmp_path / "twice.csv").write_text("path,label,label\nimg/a/0.png,a,a\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    images, out = str(tmp_path / "img"), str(tmp_path / "out")
    cases = [
        ([f"--input={tmp_path / 'empty'}"], "holds no files"),
        ([f"--input={tmp_path / 'folder.csv'}"], "is a folder, not a manifest"),
        ([f"--input={tmp_path / 'header_only.csv'}"], "lists no inputs"),
        ([f"--input={tmp_path / 'twice.csv'}"], "names column(s) label twice"),
        ([f"--input={images}", "--runner=Bogus"], "--runner=Bogus: Unexpected pipeline runner"),
        ([f"--input={images}", f"--labels={tmp_path}"], "--labels: "),
        ([f"--input={images}", f"--labels={tmp_path / 'latin1.txt'}"], "is not UTF-8"),
    ]
    for argv, message in cases:
        assert cli.main(["convert", *argv, f"--output_dir={out}"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)
    assert not os.path.exists(out)


def test_inspect_validate_and_shuffle_report_errors_are_one_line(tmp_path, capsys):
    (tmp_path / layout.INFO_FILE).write_text(json.dumps({"hello": "world"}))
    for command in ("inspect", "validate"):
        assert cli.main([command, str(tmp_path)]) == 1
        text = capsys.readouterr()
        assert "not an evenshard dataset info" in text.out + text.err
    _pngs(tmp_path / "images", [f"a/{i}.png" for i in range(6)])
    out = str(tmp_path / "out")
    write_dataset(str(tmp_path / "images"), out, "--splits=train=1.0")
    for argv, message in (
        (["--split", "nope"], "split 'nope' not in"),
        (["--batch_size", "64"], "fewer than one batch of 64"),
    ):
        png = str(tmp_path / "r.png")
        assert cli.main(["shuffle-report", out, "--out", png, *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "options,message",
    [
        ({"image_size": (0, 0)}, "image_size"),
        ({"num_workers": 0, "worker_index": 0}, "num_workers must be >= 1"),
        ({"channels": 2}, "channels"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_make_dataset_checks_options_when_built(options, message):
    with pytest.raises(ValueError, match=message):
        reader.make_dataset("/nonexistent/never/read", "train", **options)


def _encoded(im, fmt, **params):
    import io

    out = io.BytesIO()
    im.save(out, fmt, **params)
    return out.getvalue()


def _bad_idat_crc(png: bytes) -> bytes:
    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at : at + 4], "big")
    crc = at + 8 + length
    return png[:crc] + bytes(b ^ 0xFF for b in png[crc : crc + 4]) + png[crc + 4 :]


def test_what_convert_accepts_the_reader_decodes_to_pillows_pixels(tmp_path):
    """Formats x modes x quirks: each rejected with a reason, or read back exactly."""
    from PIL import Image

    rng = np.random.default_rng(3)
    base = Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8), "RGB")
    frames = [base, Image.fromarray(255 - np.asarray(base))]
    accepted = {
        "bmp24.bmp": _encoded(base, "BMP"),
        "bmp32.bmp": _encoded(base.convert("RGBA"), "BMP"),
        "still.webp": _encoded(base, "WEBP", lossless=True),
        "rgba.png": _encoded(base.convert("RGBA"), "PNG"),
        "gray.png": _encoded(base.convert("L"), "PNG"),
        "palette.png": _encoded(base.convert("P"), "PNG"),
        "interlaced.png": _encoded(base, "PNG", interlace=1),
        "anim.gif": _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:]),
    }
    png = _encoded(base, "PNG")
    rejected = {
        "bmp1.bmp": (_encoded(base.convert("1"), "BMP"), "unsupported_format"),
        "bmp8_palette.bmp": (_encoded(base.convert("P"), "BMP"), "unsupported_format"),
        "bmp8_gray.bmp": (_encoded(base.convert("L"), "BMP"), "unsupported_format"),
        "anim_lossy.webp": (
            _encoded(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=False),
            "unsupported_format",
        ),
        "bad_crc.png": (_bad_idat_crc(png), "corrupt"),
    }
    for name, data in {**accepted, **{k: v for k, (v, _) in rejected.items()}}.items():
        (tmp_path / "images" / "a").mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / "a" / name).write_bytes(data)
    out = str(tmp_path / "out")
    info = run_convert(str(tmp_path / "images"), out, "--splits=all=1.0", "--max_reject_fraction=1")
    got = {os.path.basename(r["key"]): r["reason"] for r in read_rejects(out)}
    assert got == {name: reason for name, (_, reason) in rejected.items()}
    assert _accounted(info) == len(accepted)
    assert validate(out, full=True) == []  # recorded shape = what the reader's decoder yields
    for channels, mode in ((1, "L"), (3, "RGB"), (4, "RGBA")):
        ds = reader.make_dataset(out, "all", batch_size=None, shuffle=False, channels=channels)
        for ex in ds:
            name = os.path.basename(ex["key"].numpy().decode())
            with Image.open(tmp_path / "images" / "a" / name) as im:
                if mode == "RGBA" or im.mode in ("L", "P", "RGB"):
                    expected = np.asarray(im.convert("RGB").convert(mode))
                else:
                    expected = np.asarray(im.convert(mode))
            if mode == "L":  # grey from colour: TF and Pillow round differently, by 1 at most
                diff = np.abs(ex["image"].numpy()[..., 0].astype(int) - expected.astype(int))
                assert diff.max() <= 1, name
            else:
                assert np.array_equal(ex["image"].numpy(), expected.reshape(ex["image"].shape)), (
                    name,
                    mode,
                )


@pytest.mark.parametrize("verify", ["full", "header"])
def test_dedupe_content_keeps_one_copy_of_each_image(tmp_path, verify):
    root = tmp_path / "images"
    _pngs(root, [f"a/{i}.png" for i in range(3)] + [f"b/{i}.png" for i in range(3)], seed=4)
    copies = {"b/copy_of_a0.png": "a/0.png", "c/again.png": "a/0.png", "a/z.png": "b/2.png"}
    for copy, original in copies.items():
        (root / copy).parent.mkdir(exist_ok=True)
        (root / copy).write_bytes((root / original).read_bytes())
    flags = ["--max_reject_fraction=1", f"--verify={verify}", "--splits=train=0.5,test=0.5"]
    if verify == "full":  # once: --verify does not change what is an example without dedupe
        plain = run_convert(str(root), str(tmp_path / "plain"), *flags)
        assert _accounted(plain) == 9  # off by default: every copy is an example
    out = str(tmp_path / "deduped")
    info = run_convert(str(root), out, *flags, "--dedupe=content")
    assert _accounted(info) == 6 and info["dedupe"] == "content"
    assert info["rejects"]["by_reason"] == {"duplicate_content": 3}
    got = {r["key"]: r["detail"] for r in read_rejects(out)}
    # the smallest key of each content is kept: a/z.png sorts before b/2.png
    assert got == {
        "b/copy_of_a0.png": "the same bytes as a/0.png",
        "c/again.png": "the same bytes as a/0.png",
        "b/2.png": "the same bytes as a/z.png",
    }


@pytest.mark.fast
def test_a_row_naming_a_url_of_another_scheme_is_a_bad_path_not_a_missing_file():
    """Convert reads gs:// and s3:// only: a row naming hdfs:// or http:// says so."""
    from convert_core.candidates import CandidateRules

    rules = CandidateRules(root="/m", path_root=None, kind="image", vocabulary=None, group_by=None)
    for url in ("hdfs://nn/x.jpg", "http://host/x.jpg"):
        reject = rules.row(2, {"path": url, "label": "a"})
        assert reject.reason == "bad_path" and "gs:// and s3://" in reject.detail, reject
