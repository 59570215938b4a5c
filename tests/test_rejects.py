"""Every reject reason from a crafted input; user mistakes stop the job before any work."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import load_info, read_rejects, run_convert
from corpus import bomb_png

from audit.validate import validate
from evenshard import cli, synthetic


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """A folder with one good image per label and one crafted file per reason."""
    rng = np.random.default_rng(5)
    root = tmp_path_factory.mktemp("crafted") / "images"
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(4):
            (root / label / f"good_{i}.png").write_bytes(synthetic.image_bytes("png", 16, 16, rng))
    jpeg = synthetic.image_bytes("jpeg", 64, 64, rng)
    png = synthetic.image_bytes("png", 64, 64, rng)
    files = {
        "a/empty.jpg": (b"", "empty"),
        "a/text.jpg": (b"hello, not an image", "unsupported_format"),
        "a/drawing.svg": (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "unsupported_format"),
        "a/icon.png": (b"II*\x00" + jpeg[4:200], "unsupported_format"),  # TIFF magic
        "a/garbled.jpg": (jpeg[:120] + bytes(len(jpeg) - 120), "corrupt"),
        "a/garbled.png": (png[:60] + bytes(len(png) - 60), "corrupt"),
        "a/cut.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
        "a/cut.png": (png[: len(png) // 2], "truncated"),
        "a/bomb.png": (bomb_png(100_000, 100_000), "too_large"),
        "loose.png": (png, "bad_label"),
    }
    for rel, (data, _) in files.items():
        (root / rel).write_bytes(data)
    os.symlink("loop.jpg", root / "b" / "loop.jpg")  # a symlink loop
    os.symlink("nowhere.jpg", root / "b" / "dangling.jpg")
    (root / "a" / ".hidden.jpg").write_bytes(b"ignored: hidden files are not inputs")
    expected = {rel: reason for rel, (_, reason) in files.items()}
    expected.update({"b/loop.jpg": "unreadable", "b/dangling.jpg": "missing"})
    return str(root), expected


def test_each_crafted_file_is_rejected_with_its_reason(crafted, tmp_path):
    root, expected = crafted
    out = str(tmp_path / "out")
    info = run_convert(root, out, "--max_reject_fraction=1")
    got = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert got == expected
    assert info["inputs"] == 8 + len(expected)
    assert info["inputs"] == 8 + info["rejects"]["total"]
    for r in read_rejects(out):
        assert r["detail"] and r["source"].startswith(root)


def test_header_verify_still_rejects_what_it_can_see(crafted, tmp_path):
    root, expected = crafted
    expected = dict(expected)
    out = str(tmp_path / "out")
    run_convert(root, out, "--max_reject_fraction=1", "--verify=header", validated=False)
    got = {r["key"]: r["reason"] for r in read_rejects(out)}
    # header-only checks cannot see a truncated or garbled body: those pass
    for key in ("a/cut.jpg", "a/cut.png", "a/garbled.png"):
        expected.pop(key)
    assert {k: v for k, v in got.items() if k in expected} == expected
    # ... and validate --full finds exactly them: their images do not decode
    assert len(validate(out, full=True)) == 3


def test_max_image_pixels_rejects_as_too_large(crafted, tmp_path):
    root, _ = crafted
    out = str(tmp_path / "out")
    run_convert(root, out, "--max_reject_fraction=1", "--max_image_pixels=255")
    reasons = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert reasons["a/good_0.png"] == "too_large"  # 16x16 = 256 pixels


def test_manifest_rejects(crafted, tmp_path):
    root, _ = crafted
    rows = [
        "path,label,split",
        "images/a/good_0.png,a,",
        "images/a/good_1.png,a,",
        "images/a/good_1.png,a,",  # duplicate key (the path): the first row is kept
        "images/a/missing.png,a,",
        "../outside.png,a,",
        "images/a/good_2.png,,",  # no label
        "images/a/good_3.png,zebra,",  # not in --labels
        "images/b/good_0.png,b,bad split!",
        "images/b/good_1.png,b,val,extra",  # malformed: too many fields
        "",  # blank lines are not inputs
        "images/b/good_2.png,b,",
    ]
    # Manifests sit beside the image folder, never in it (they would be inputs there).
    manifest = os.path.join(os.path.dirname(root), "m.csv")
    with open(manifest, "w", encoding="utf-8-sig", newline="") as f:
        f.write("\r\n".join(rows) + "\r\n")  # a BOM and CRLF line ends
    vocab = tmp_path / "labels.txt"
    vocab.write_text("a\nb\n")
    out = str(tmp_path / "out")
    info = run_convert(manifest, out, "--max_reject_fraction=1", f"--labels={vocab}")
    got = sorted((r["key"], r["reason"]) for r in read_rejects(out))
    assert got == sorted(
        [
            ("images/a/good_1.png", "duplicate_key"),
            ("images/a/missing.png", "missing"),
            ("../outside.png", "bad_path"),
            ("images/a/good_2.png", "bad_label"),
            ("images/a/good_3.png", "bad_label"),
            ("images/b/good_0.png", "bad_split"),
            ("row:10", "malformed_row"),
        ]
    )
    assert info["inputs"] == 10
    assert sum(s["num_examples"] for s in info["splits"].values()) == 3
    assert info["labels"] == ["a", "b"]


def test_jsonl_manifest_with_malformed_lines(crafted, tmp_path):
    root, _ = crafted
    manifest = os.path.join(os.path.dirname(root), "m.jsonl")
    with open(manifest, "w") as f:
        f.write(json.dumps({"path": "images/a/good_0.png", "label": "a", "key": "k0"}) + "\n")
        f.write("{not json\n\n")
        f.write(json.dumps(["a", "list"]) + "\n")
        f.write(json.dumps({"label": "a"}) + "\n")
        f.write(json.dumps({"path": "images/b/good_0.png", "label": "b", "key": "k1"}) + "\n")
    out = str(tmp_path / "out")
    info = run_convert(manifest, out, "--max_reject_fraction=1")
    got = sorted((r["key"], r["reason"]) for r in read_rejects(out))
    assert got == [
        ("row:2", "malformed_row"),
        ("row:4", "malformed_row"),
        ("row:5", "malformed_row"),
    ]
    assert info["inputs"] == 5


def test_a_stray_quote_in_a_csv_manifest_rejects_every_line_it_takes(crafted, tmp_path):
    """A quoted field over several lines (a stray quote, closed later or never) is a
    malformed_row for each non-blank line it took: inputs count physical rows."""
    root, _ = crafted
    lines = [
        "path,label",
        "images/a/good_0.png,a",
        '"images/a/good_1.png,a',  # 3: closed on line 4
        'images/a/good_2.png",a',
        "images/a/good_3.png,a",
        '"images/b/good_0.png,b',  # 6: never closed
        "images/b/good_1.png,b",
        "",  # blank lines are not inputs, inside the field or not
        "images/b/good_2.png,b",
    ]
    manifest = os.path.join(os.path.dirname(root), "quote.csv")
    with open(manifest, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = str(tmp_path / "out")
    info = run_convert(manifest, out, "--max_reject_fraction=1")
    rejects = {r["key"]: r for r in read_rejects(out)}
    assert sorted(rejects) == ["row:3", "row:4", "row:6", "row:7", "row:9"]
    assert {r["reason"] for r in rejects.values()} == {"malformed_row"}
    assert "lines 3-4" in rejects["row:3"]["detail"]
    assert "lines 6-9" in rejects["row:6"]["detail"] and "row 6" in rejects["row:9"]["detail"]
    assert info["inputs"] == 7 and info["rejects"]["total"] == 5


def test_too_many_rejects_fail_after_writing_rejects_and_no_info(crafted, tmp_path, capsys):
    root, expected = crafted
    out = str(tmp_path / "out")
    code = cli.main(["convert", f"--input={root}", f"--output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert "inputs were rejected, above --max_reject_fraction=0.01" in err[-1]
    assert len(read_rejects(out)) == len(expected)
    assert not os.path.exists(os.path.join(out, "dataset_info.json"))
    assert not [f for f in os.listdir(out) if ".tfrecord" in f]


def test_an_input_rewritten_while_convert_runs_is_a_changed_reject(tmp_path, monkeypatch, capsys):
    """An image rewritten between inspection and the shard writer (same size, not an
    image any more) went into a dataset declared complete. It is a `changed` reject and
    the run writes no dataset, in one line; a rerun inspects the new bytes."""
    import functools

    from beam_jobs.inspect_images import InspectImage
    from schemas import tfrecord

    rng = np.random.default_rng(7)
    root = tmp_path / "images"
    for i in range(6):
        (root / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        (root / "ab"[i % 2] / f"{i}.png").write_bytes(synthetic.image_bytes("png", 8, 8, rng))
    victim = root / "a" / "2.png"
    inspect = InspectImage.process

    @functools.wraps(inspect)
    def inspect_then_rewrite(self, candidate):  # another program writes the file meanwhile
        yield from inspect(self, candidate)
        if candidate.key == "a/2.png":
            victim.write_bytes(victim.read_bytes()[::-1])

    monkeypatch.setattr(InspectImage, "process", inspect_then_rewrite)
    # one inspection at a time: with threads the rewrite could land before the victim's
    # inspection reads it, a corrupt reject there rather than the writer's `changed`
    monkeypatch.setattr("beam_jobs.inspect_images.local_threads", lambda options: 1)
    out = tmp_path / "out"
    argv = ["convert", f"--input={root}", f"--output_dir={out}", "--max_reject_fraction=1"]
    argv.append("--direct_running_mode=in_memory")  # the same process: the rewrite runs
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"1 input(s) changed while convert ran ({victim})" in err[0], err
    assert not (out / "dataset_info.json").exists()
    rejects = read_rejects(str(out))
    assert [(r["key"], r["reason"]) for r in rejects] == [("a/2.png", "changed")]
    assert "other bytes than those inspected" in rejects[0]["detail"]
    shards = [p for p in out.iterdir() if p.name.endswith(".tfrecord")]
    written = sum(1 for p in shards for _ in tfrecord.iter_records(str(p)))
    assert written + len(rejects) == 6  # inputs = written + rejects, in what is there
    monkeypatch.undo()
    info = run_convert(str(root), str(out), "--max_reject_fraction=1")
    assert info["rejects"]["by_reason"] == {"unsupported_format": 1}


USER_ERRORS = [
    (["--input={missing}", "--output_dir={out}"], "does not exist"),
    (["--input={root}", "--output_dir={out}", "--splits=train=0.8,val=0.1"], "sum to 1"),
    (["--input={root}", "--output_dir={out}", "--splits=train=1.5"], "(0, 1]"),
    (["--input={root}", "--output_dir={out}", "--record_kind=jpeg"], "--record_kind"),
    (["--input={root}", "--output_dir={out}", "--balance=class"], "--balance"),
    (["--input={root}", "--output_dir={out}", "--seeed=3"], "unknown flag(s): --seeed"),
    (["--input={root}", "--output_dir={out}", "--num_shards=0"], "--num_shards"),
    (["--input={root}", "--output_dir={out}", "--group_by=subject"], "manifest"),
    (["--output_dir={out}"], "--input"),
    (["--input={root}", "--output_dir={root}/sub"], "inside the input folder"),
]


@pytest.mark.parametrize("argv,message", USER_ERRORS)
def test_user_errors_exit_with_one_line_before_any_work(argv, message, crafted, tmp_path, capsys):
    root, _ = crafted
    out = tmp_path / "out"
    argv = [a.format(root=root, out=out, missing=tmp_path / "nope") for a in argv]
    assert cli.main(["convert", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_finished_dataset_needs_overwrite(crafted, tmp_path, capsys):
    root, _ = crafted
    out = str(tmp_path / "out")
    run_convert(root, out, "--max_reject_fraction=1")
    before = load_info(out)
    assert (
        cli.main(["convert", f"--input={root}", f"--output_dir={out}", "--max_reject_fraction=1"])
        == 2
    )
    assert "holds a finished dataset; pass --overwrite" in capsys.readouterr().err
    stray = os.path.join(out, "train-00009-of-00010.tfrecord")  # left by another run
    open(stray, "wb").close()
    assert (
        cli.main(
            ["convert"]
            + [
                f"--input={root}",
                f"--output_dir={out}",
                "--max_reject_fraction=1",
                "--overwrite",
                "--num_shards=1",
            ]
        )
        == 0
    )
    # no run recorded it as its own: it is kept (convert names it in a warning)
    assert os.path.exists(stray)
    assert load_info(out)["inputs"] == before["inputs"]


def _damage(data: bytes, k: int, pick) -> bytes:
    """Damaged copy ``k`` of a JPEG: cut short, 8 bytes garbled, or a hole, by turns."""
    b = bytearray(data)
    if k % 3 == 0:
        b = b[: pick.randrange(len(b) // 4, len(b))]
    elif k % 3 == 1:
        i = pick.randrange(len(b) // 3, len(b) - 8)
        b[i : i + 8] = bytes(pick.randrange(256) for _ in range(8))
    else:
        i = pick.randrange(len(b) // 3, len(b) - 60)
        del b[i : i + pick.randrange(1, 50)]
    return bytes(b)


@pytest.mark.parametrize("progressive", [False, True])
def test_full_verify_of_jpeg_rejects_what_a_full_decode_rejects(progressive):
    """--verify full decodes JPEGs with libjpeg's DCT scaling (every block entropy-
    decoded, the inverse DCT at 1/8 size): cut, garbled and holed bodies get the
    verdict a full-size decode gives them."""
    import io
    import random
    import warnings

    from PIL import Image as PILImage

    from schemas.images import Rejected, inspect_stream

    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels).save(out, "JPEG", quality=90, progressive=progressive)
    data = out.getvalue()
    pick = random.Random(1)
    rejected = 0
    for k in range(90):
        b = _damage(data, k, pick)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                PILImage.open(io.BytesIO(bytes(b))).load()
            expected = True
        except Exception:  # noqa: BLE001 - any failure is a reject
            expected = False
        try:
            inspect_stream(io.BytesIO(bytes(b)), len(b), full=True, max_pixels=10**9)
            got = True
        except Rejected:
            got = False
        assert got == expected, k
        rejected += not got
    assert 10 < rejected < 80  # both verdicts were exercised


def _jpeg_variants() -> list[bytes]:
    """JPEGs of every colour space and coding convert meets, then damaged copies of each."""
    import io
    import random

    from PIL import Image as PILImage

    rng = np.random.default_rng(5)
    rgb = PILImage.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8))
    made = []
    for image, kwargs in [
        (rgb, {"quality": 90}),
        (rgb, {"quality": 75, "subsampling": 0}),
        (rgb, {"quality": 80, "progressive": True}),
        (rgb.convert("L"), {}),
        (rgb.convert("CMYK"), {}),
        (rgb, {"format": "MPO", "save_all": True, "append_images": [rgb.rotate(90)]}),
    ]:
        out = io.BytesIO()
        image.save(out, **{"format": "JPEG", **kwargs})
        made.append(out.getvalue())
    # segments libjpeg passes over and Pillow's header parser refuses (a short JFIF
    # or Adobe segment, a TEM marker), right after the SOI of the first
    made += [
        made[0][:2] + extra + made[0][2:]
        for extra in (b"\xff\xe0\x00\x07JFIF\x00", b"\xff\xee\x00\x07Adobe", b"\xff\x01")
    ]
    pick = random.Random(2)
    return made + [_damage(data, k, pick) for data in made for k in range(30)]


@pytest.mark.fast
def test_a_clean_jpeg_decode_gives_pillows_verdict_and_facts():
    """--verify full skips Pillow's decode of a JPEG that libjpeg-turbo decodes without a
    warning (schemas.images._decodes_cleanly), after Pillow's open: every such file is
    one Pillow's decode passes, so every file gets Pillow's verdict, reason and facts."""
    import io

    from schemas import images
    from schemas.images import Rejected, inspect_stream

    fast_taken = pillow_rejected = 0
    variants = _jpeg_variants()
    for data in variants:
        try:  # a stream that is not a BytesIO: Pillow's path alone
            pillow = inspect_stream(
                io.BufferedReader(io.BytesIO(data)), len(data), full=True, max_pixels=10**9
            )
        except Rejected as r:
            pillow = r.reason
        if images._decodes_cleanly(io.BytesIO(data)):
            fast_taken += 1
        try:
            got = inspect_stream(io.BytesIO(data), len(data), full=True, max_pixels=10**9)
        except Rejected as r:
            got = r.reason
        assert got == pillow
        pillow_rejected += isinstance(pillow, str)
    assert fast_taken >= 9 and pillow_rejected >= 40  # both paths were exercised
    # the segments Pillow refuses decode cleanly, and are still Pillow's rejects
    assert all(images._decodes_cleanly(io.BytesIO(data)) for data in variants[6:9])
