"""convert --dedupe near (issue 55): a cluster holds near-duplicates of one centre, so
the copies of one picture stay one cluster at any count, and a chain of small steps
(sliding crops, a brightness ramp) is cut into several clusters, never one.

The pictures are photo-like (``evenshard.synthetic.photo_bytes``), small, so the
tests stay quick; the forms are those a real collection holds: sizes, JPEG
qualities, PNG, brightened and darkened, cut a little at an edge.
"""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pytest
from conftest import assert_multi_process_gives_the_same_bytes, read_rejects, run_convert
from PIL import Image, ImageEnhance
from test_near import split_of_keys

from evenshard.synthetic import photo_bytes
from schemas import near
from schemas.images import inspect_stream

# one picture as a wallpaper package ships it: 13 sizes (two of another aspect)
SIZES = ((48, 36), (56, 42), (64, 48), (72, 54), (80, 60), (96, 72), (112, 84))
SIZES += ((128, 96), (144, 108), (160, 120), (192, 144), (72, 48), (120, 80))
FORMS = 8
OTHERS = 30


def _encoded(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def forms(im: Image.Image) -> list[bytes]:
    """The ``FORMS`` forms of one image: three JPEG qualities, PNG, brighter, darker,
    cut 4 % at the left, cut 4 % at the top and 2 % at the bottom."""
    w, h = im.size
    return [
        _encoded(im, quality=92),
        _encoded(im, quality=70),
        _encoded(im, quality=45),
        _encoded(im, "PNG"),
        _encoded(ImageEnhance.Brightness(im).enhance(1.1), quality=85),
        _encoded(ImageEnhance.Brightness(im).enhance(0.92), quality=85),
        _encoded(im.crop((w // 25, 0, w, h)), quality=85),
        _encoded(im.crop((0, h // 25, w, h - h // 50)), quality=85),
    ]


def picture(seed: int, height: int = 150, width: int = 200) -> Image.Image:
    return Image.open(io.BytesIO(photo_bytes(np.random.default_rng(seed), height, width, 95)))


def fingerprint(data: bytes) -> near.Parsed:
    """As convert's inspection takes it (a JPEG decoded at reduced scale)."""
    *_, value = inspect_stream(io.BytesIO(data), len(data), full=True, max_pixels=10**9, near=True)
    return near.parse(value)


@pytest.fixture(scope="module")
def wallpaper(tmp_path_factory):
    """One picture at 13 sizes x 8 forms (``wall/``, 104 images) beside 30 other
    pictures' 8 forms each (``other/``): the folder and {key: picture}."""
    root = tmp_path_factory.mktemp("linkage") / "images"
    truth = {}
    for label in ("wall", "other"):
        (root / label).mkdir(parents=True)
    big = picture(100)
    for s, size in enumerate(SIZES):
        for f, data in enumerate(forms(big.resize(size, Image.LANCZOS))):
            name = f"wall/s{s:02d}_f{f}.{'png' if f == 3 else 'jpg'}"
            (root / name).write_bytes(data)
            truth[name] = -1
    for i in range(OTHERS):
        for f, data in enumerate(forms(picture(i).resize((96, 72), Image.LANCZOS))):
            name = f"other/p{i:02d}_f{f}.{'png' if f == 3 else 'jpg'}"
            (root / name).write_bytes(data)
            truth[name] = i
    return str(root), truth


def test_one_picture_in_104_forms_is_one_cluster_in_one_split(wallpaper, tmp_path):
    """Issue 55: the cap of 16 cut the 104 into pieces, 56 in train and 48 in val."""
    root, truth = wallpaper
    out = str(tmp_path / "out")
    info = run_convert(root, out, "--dedupe=near", "--splits=train=0.8,val=0.2")
    where = split_of_keys(out)
    assert len(where) == len(truth)
    for source in set(truth.values()):
        assert len({where[k] for k, s in truth.items() if s == source}) == 1, source
    found = info["near_duplicates"]
    assert found["clusters"] == OTHERS + 1
    assert found["largest_cluster"] == len(SIZES) * FORMS == 104
    assert found["inputs_in_clusters"] == len(truth)
    assert "largest_allowed" not in found and "bridges" not in found


def test_keep_one_keeps_one_image_of_the_104(wallpaper, tmp_path):
    root, truth = wallpaper
    out = str(tmp_path / "one")
    info = run_convert(
        root, out, "--dedupe=near", "--near_keep=one", "--max_reject_fraction=1", "--splits=all=1"
    )
    kept = set(split_of_keys(out))
    assert len(kept) == OTHERS + 1
    assert Counter(truth[k] for k in kept) == Counter(set(truth.values()))  # one a picture
    rejects = read_rejects(out)
    assert len(rejects) == len(truth) - OTHERS - 1 == info["near_duplicates"]["rejected"]
    walls = [r for r in rejects if r["key"].startswith("wall/")]
    assert len(walls) == 103
    assert {r["detail"] for r in walls} == {
        "in the cluster of near-duplicates of wall/s00_f0.jpg, which is kept"
    }


def test_a_picture_with_a_thousand_copies_is_one_cluster_in_one_split(tmp_path):
    """1,000 re-encodes of one small picture (25 sizes x 40 JPEG qualities) among 40
    other pictures: one cluster of 1,000, in one split."""
    root = tmp_path / "images"
    (root / "copy").mkdir(parents=True)
    (root / "other").mkdir()
    big = picture(7, 90, 120)
    copies = []
    for s in range(25):
        im = big.resize((40 + 2 * s, 30 + 2 * s * 3 // 4), Image.BILINEAR)
        for q in range(40):
            name = f"copy/s{s:02d}_q{q:02d}.jpg"
            (root / name).write_bytes(_encoded(im, quality=35 + q * 3 // 2))
            copies.append(name)
    for i in range(40):
        (root / "other" / f"p{i:02d}.jpg").write_bytes(_encoded(picture(200 + i, 30, 40)))
    out = str(tmp_path / "out")
    info = run_convert(str(root), out, "--dedupe=near", "--splits=a=0.5,b=0.5")
    where = split_of_keys(out)
    assert len(copies) == 1000 and len({where[k] for k in copies}) == 1
    found = info["near_duplicates"]
    assert (found["clusters"], found["largest_cluster"]) == (1, 1000)
    assert found["inputs_in_clusters"] == 1000


def crops(photo: Image.Image) -> list[bytes]:
    """41 crops of ``photo``, a 60 % window sliding 1 % of the width a step."""
    w, h = photo.size
    return [
        _encoded(photo.crop((w * i // 100, 0, w * i // 100 + w * 60 // 100, h)), quality=90)
        for i in range(41)
    ]


def ramp(photo: Image.Image) -> list[bytes]:
    """100 steps of brightness, 0.1x to 3x (each step 3.5 % brighter than the last)."""
    return [
        _encoded(ImageEnhance.Brightness(photo).enhance(0.1 * 30 ** (i / 99)), quality=90)
        for i in range(100)
    ]


def is_a_chain(values: list[near.Parsed]) -> bool:
    """Whether each step matches the next and the two ends do not match."""
    links = [near.matches(a, b, near.DEFAULT_DISTANCE) for a, b in zip(values, values[1:])]
    ends = near.matches(values[0], values[-1], near.DEFAULT_DISTANCE)
    return all(link is not None for link in links) and ends is None


def has_a_centre(cluster: list[near.Parsed]) -> bool:
    """Whether one member matches every other member (the star's centre)."""
    return any(
        all(near.matches(c, m, near.DEFAULT_DISTANCE) is not None for m in cluster) for c in cluster
    )


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    """41 sliding crops of one photo (``crop/c00`` .. ``c40``), a brightness ramp of 100
    steps of another (``ramp/r00`` .. ``r99``) and 20 unrelated photos: the folder and
    {key: fingerprint} of the chains' images."""
    root = tmp_path_factory.mktemp("chains") / "images"
    made = {"crop": crops(picture(1, 120, 240)), "ramp": ramp(picture(2, 72, 96))}
    values = {}
    for kind, data in made.items():
        (root / kind).mkdir(parents=True)
        for i, d in enumerate(data):
            (root / kind / f"{kind[0]}{i:02d}.jpg").write_bytes(d)
            values[f"{kind}/{kind[0]}{i:02d}.jpg"] = fingerprint(d)
        assert is_a_chain([fingerprint(d) for d in data]), kind  # one component
    (root / "other").mkdir()
    for i in range(20):
        (root / "other" / f"p{i:02d}.jpg").write_bytes(_encoded(picture(300 + i, 48, 64)))
    return str(root), values


def test_sliding_crops_and_a_brightness_ramp_are_several_clusters_none_chained(chains, tmp_path):
    """Each chain is one component of matches end to end (its ends do not match), but
    several clusters, each with a centre that every member matches: no member is in
    its cluster only through a chain of small steps."""
    root, values = chains
    out = str(tmp_path / "one")
    run_convert(root, out, "--dedupe=near", "--near_keep=one", "--max_reject_fraction=1")
    kept = set(split_of_keys(out))
    members: dict[str, list[str]] = {k: [k] for k in kept}
    for r in read_rejects(out):
        keeper = r["detail"].removeprefix("in the cluster of near-duplicates of ").split(",")[0]
        members[keeper].append(r["key"])
    for kind, count in (("crop", 41), ("ramp", 100)):
        clusters = [m for k, m in members.items() if k.startswith(kind)]
        assert len(clusters) > 1, kind  # not one cluster
        assert sum(len(m) for m in clusters) == count
        for m in clusters:
            assert has_a_centre([values[k] for k in m]), (kind, sorted(m))
    assert sum(k.startswith("other/") for k in kept) == 20


def test_the_same_bytes_in_memory_and_with_two_processes(chains, tmp_path):
    """The components cut into clusters depend on the inputs, never on bundle order."""
    assert_multi_process_gives_the_same_bytes(
        chains[0], tmp_path, "--dedupe=near", "--splits=a=0.5,b=0.5"
    )
