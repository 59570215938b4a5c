"""WebDataset tars as convert's input (issue 42): written by ``webdataset``'s own
``ShardWriter``, converted, and read back with ``reader.make_dataset``."""

from __future__ import annotations

import os

import pytest
from conftest import assert_multi_process_gives_the_same_bytes, read_rejects, run_convert
from test_tfrecord_input import pngs, read_back

from beam_jobs import convert
from convert_core.options import UserError

FLAGS = ["--input_format=webdataset", "--num_shards=2", "--max_reject_fraction=0.5"]


def write_tars(pattern: str, samples: list[dict], maxcount: int) -> list[str]:
    """Tars as ``webdataset.ShardWriter`` writes them (``maxcount`` samples a tar)."""
    import webdataset as wds

    os.makedirs(os.path.dirname(pattern), exist_ok=True)
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    return sorted(
        os.path.join(os.path.dirname(pattern), f) for f in os.listdir(os.path.dirname(pattern))
    )


def samples(n: int, seed: int = 0, **fields) -> list[dict]:
    return [
        {"__key__": f"s{i:04d}", "png": im, **{k: v(i) for k, v in fields.items()}}
        for i, im in enumerate(pngs(n, seed))
    ]


def test_tars_written_by_webdataset_convert_and_read_back_once(tmp_path):
    root = str(tmp_path / "in")
    # label-sorted: the first tar holds label 0 only; cls and a json of metadata; the
    # image a png or a jpg member (a sample's one image is the feature "image")
    mixed = samples(12, cls=lambda i: i // 6, json=lambda i: {"w": 8})
    for s in mixed[::3]:
        s["jpg"] = s.pop("png")
    write_tars(f"{root}/train-%03d.tar", mixed, 6)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    assert info["inputs"] == 12 and info["rejects"]["total"] == 0
    assert info["labels"] == ["0", "1"]
    expected = {(f"train-{i // 6:03d}.tar#{i % 6}", i // 6): 1 for i in range(12)}
    assert read_back(out) == expected


def test_damaged_tars_give_named_rejects_and_counts_reconcile(tmp_path):
    root = str(tmp_path / "in")
    good, cut = write_tars(f"{root}/p-%03d.tar", samples(8, cls=lambda i: i % 2), 4)
    import tarfile

    with tarfile.open(cut) as t:
        image = t.getmember("s0006.png")  # sample 2 of the second tar
    with open(cut, "r+b") as f:  # cut inside its image
        f.truncate(image.offset_data + image.size // 2)
    with open(f"{root}/text.tar", "w") as f:
        f.write("not a tar at all, but long enough to hold a header\n")
    write_tars(f"{root}/gz/q-%03d.tar.gz", samples(3, seed=1, cls=lambda i: 1), 3)
    write_tars(f"{root}/bad/b-%03d.tar", samples(1, png=lambda i: b"GIF89a no", cls=lambda i: 0), 1)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {
        ("p-001.tar#2", "truncated"),
        ("text.tar#0", "corrupt"),
        ("bad/b-000.tar#0", "corrupt"),
    }
    details = {r["key"]: r["detail"] for r in read_rejects(out)}
    assert "sample 2" in details["p-001.tar#2"] and "byte" in details["p-001.tar#2"]
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert written == 4 + 2 + 3  # the samples before the damage are kept
    assert info["inputs"] == written + info["rejects"]["total"] == 12
    assert set(read_back(out)) == {
        *((f"p-000.tar#{i}", i % 2) for i in range(4)),
        *((f"p-001.tar#{i}", i % 2) for i in range(2)),
        *((f"gz/q-000.tar.gz#{i}", 1) for i in range(3)),
    }


def test_in_memory_and_multi_process_give_the_same_bytes(tmp_path):
    root = str(tmp_path / "in")
    write_tars(f"{root}/t-%03d.tar", samples(24, cls=lambda i: i % 3), 8)
    assert_multi_process_gives_the_same_bytes(root, tmp_path, *FLAGS, "--balance=label")


def test_json_labels_keys_by_flag_and_ambiguity_is_one_line(tmp_path):
    root = str(tmp_path / "in")
    names = ["cat", "dog"]
    write_tars(
        f"{root}/t-%03d.tar",
        samples(4, json=lambda i: {"label": names[i // 2], "width": 8}, txt=lambda i: "a caption"),
        4,
    )
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS, "--key_feature=__key__")
    assert info["labels"] == names  # json.label, the text label its name says
    assert set(read_back(out)) == {(f"s{i:04d}", i // 2) for i in range(4)}
    argv = [f"--input={root}", f"--output_dir={tmp_path / 'o2'}", "--input_format=webdataset"]
    with pytest.raises(UserError) as e:  # width and txt could each be the label
        convert.run(
            [*argv, "--image_feature=image", "--key_feature=__key__", "--label_feature=nope"]
        )
    assert "\n" not in str(e.value) and "nope" in str(e.value) and "json.width" in str(e.value)
    other = str(tmp_path / "other")
    write_tars(f"{other}/t-%03d.tar", samples(2, json=lambda i: {"width": 8}, txt=lambda i: "x"), 2)
    with pytest.raises(UserError) as e:
        convert.run([f"--input={other}", *argv[1:]])
    assert "\n" not in str(e.value)
    assert "--label_feature" in str(e.value) and "json.width, txt" in str(e.value)


@pytest.mark.fast
def test_the_writer_reads_images_again_and_names_one_that_changed(tmp_path):
    import zlib

    from beam_jobs.webdataset_source import _samples, images_again
    from convert_core.records import Image

    [plain] = write_tars(f"{tmp_path}/a/t-%03d.tar", samples(3, cls=lambda i: 0), 3)
    [gz] = write_tars(f"{tmp_path}/b/t-%03d.tar.gz", samples(3, cls=lambda i: 0), 3)
    items = []
    for path in (plain, gz):
        with open(path, "rb") as f:
            for _, members in _samples(f):
                offset, data = members["png"]
                im = Image("k", "", "", "0", None, None, "png", 8, 8, 3, len(data),
                           crc32=zlib.crc32(data), record=(offset, len(data)))  # fmt: skip
                items.append((path, im, data))
    shard = [(p, im) for p, im, _ in reversed(items)]  # a shard's order: not the tars'
    assert list(images_again(shard, "png")) == [(d, None) for _, _, d in reversed(items)]
    wrong = items[1][1]._replace(record=items[0][1].record)
    [(_, problem)] = images_again([(plain, wrong)], "png")
    assert problem and "not the one inspected" in problem
    os.remove(gz)
    [(_, problem)] = images_again([(gz, items[4][1])], "png")
    assert problem == "the file was removed after it was inspected"


@pytest.mark.slow
def test_tars_in_a_bucket(bucket, tmp_path):
    """Tars in gs:// or s3:// (one gzip), read through Beam's file systems; the shard
    writer reads each image member again by its range."""
    local = str(tmp_path / "in")
    write_tars(f"{local}/a-%03d.tar", samples(4, cls=lambda i: 0), 4)
    write_tars(f"{local}/z/b-%03d.tar.gz", samples(5, seed=1, cls=lambda i: 1), 5)
    url = bucket.upload(local, "tars")
    out = str(tmp_path / "out")
    info = run_convert(url, out, *FLAGS)
    assert info["inputs"] == 9 and info["rejects"]["total"] == 0
    expected = {(f"a-000.tar#{i}", 0) for i in range(4)}
    expected |= {(f"z/b-000.tar.gz#{i}", 1) for i in range(5)}
    assert set(read_back(out)) == expected


def test_image_feature_named_by_its_extension_when_it_is_the_only_image(tmp_path):
    """A sample's only image member is the feature ``image``, and also its extension's:
    ``--image_feature=png`` names it (was: 'the first record has no bytes feature')."""
    root = str(tmp_path / "in")
    write_tars(f"{root}/t-%03d.tar", samples(4, cls=lambda i: i % 2), 4)
    for flag in ("png", "image"):
        out = str(tmp_path / flag)
        info = run_convert(root, out, *FLAGS, f"--image_feature={flag}")
        assert info["inputs"] == 4 and info["rejects"]["total"] == 0
        assert set(read_back(out)) == {(f"t-000.tar#{i}", i % 2) for i in range(4)}


def test_a_cls_that_only_looks_like_an_int_is_a_reject_not_a_crash(tmp_path):
    """``cls`` is an int when it is one: ``--5``, ``²`` (a digit to str.isdigit, none
    to int) and 5,000 digits (past int's limit) are text, so a ``bad_label`` reject of
    an int-labelled input (was: int()'s ValueError out of the reader, the run ended)."""
    root = str(tmp_path / "in")
    odd = {1: "--5", 2: "\u00b2", 3: "9" * 5000}
    write_tars(f"{root}/t-%03d.tar", samples(5, cls=lambda i: odd.get(i, str(i % 2))), 5)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS, "--max_reject_fraction=0.9")
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {(f"t-000.tar#{i}", "bad_label") for i in odd}
    assert set(read_back(out)) == {("t-000.tar#0", 0), ("t-000.tar#4", 0)}
    assert info["inputs"] == 5 == 2 + info["rejects"]["total"]


@pytest.mark.fast
def test_a_json_member_too_deep_to_parse_is_left_out_as_one_not_json():
    from beam_jobs.webdataset_source import _features

    found = _features("k", {"png": (512, b"x"), "json": (1024, b"[" * 100_000)})
    assert sorted(found) == ["__key__", "image", "json", "png"]


def test_a_damaged_header_or_a_cut_between_members_is_a_reject_not_the_end(tmp_path):
    """tarfile ends a stream quietly at a bad header checksum, or where the file ends
    at a member's header (a copy cut at a 512-byte boundary): the samples after it were
    lost with no reject. Each is now one reject at that sample, those before kept."""
    import tarfile

    root = str(tmp_path / "in")
    flipped, cut = write_tars(f"{root}/t-%03d.tar", samples(8, cls=lambda i: i % 2), 4)
    with tarfile.open(flipped) as t:
        header = min(m.offset for m in t if m.name.startswith("s0002."))  # sample 2's
    with open(flipped, "r+b") as f:
        f.seek(header + 3)  # in the member's name: its checksum no longer matches
        f.write(b"\xff")
    with tarfile.open(cut) as t:
        header = min(m.offset for m in t if m.name.startswith("s0006."))  # its sample 2
    with open(cut, "r+b") as f:
        f.truncate(header)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    rejects = {(r["key"], r["reason"]) for r in read_rejects(out)}
    assert rejects == {("t-000.tar#2", "corrupt"), ("t-001.tar#2", "truncated")}
    details = {r["key"]: r["detail"] for r in read_rejects(out)}
    assert "sample 2" in details["t-000.tar#2"] and "header" in details["t-000.tar#2"]
    assert set(read_back(out)) == {(f"t-00{t}.tar#{i}", i % 2) for t in (0, 1) for i in (0, 1)}
    assert info["inputs"] == 4 + 2


def test_a_sample_of_two_image_members_names_them_and_the_flag_that_picks_one(tmp_path):
    """A sample holding ``s0002.png`` and ``s0002.jpg`` has no one image: the reject
    names them and the flag that picks one, and a sample without an image its members
    (was, for both: "feature 'image': one bytes value expected, none");
    ``--image_feature png`` takes the png member of every sample."""
    root = str(tmp_path / "in")
    mixed = samples(6, cls=lambda i: i % 2)
    mixed[2]["jpg"] = mixed[0]["png"]
    del mixed[3]["png"]
    write_tars(f"{root}/t-%03d.tar", mixed, 6)
    out = str(tmp_path / "out")
    info = run_convert(root, out, *FLAGS)
    details = {(r["key"], r["reason"]): r["detail"] for r in read_rejects(out)}
    assert set(details) == {("t-000.tar#2", "missing"), ("t-000.tar#3", "missing")}
    two = details["t-000.tar#2", "missing"]
    assert "2 image members (s0002.jpg, s0002.png)" in two, two
    assert "pick one with --image_feature=jpg or --image_feature=png" in two, two
    none = details["t-000.tar#3", "missing"]
    assert "no image member (its members: s0003.cls)" in none, none
    assert info["inputs"] == 6 == 4 + info["rejects"]["total"]
    info = run_convert(root, str(tmp_path / "png"), *FLAGS, "--image_feature=png")
    assert info["inputs"] == 6 and info["rejects"]["total"] == 1  # s0003 has none
