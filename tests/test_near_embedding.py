"""convert --dedupe near --near_embedding MODULE:FUNCTION: near-duplicates by the user's
own model (here a colour histogram, tests/near_embeddings.py), the same clusters,
splits, --near_keep and audit as the perceptual hash's.

The corpus: pictures painted from palettes of their own (a few colours in blocks,
a little noise) and, for some of them, copies resized x0.5 and x2, re-encoded at
JPEG quality 60 and brightened 4 %: each copy's histogram is within a cosine of 0.9
of its picture's; two pictures' are far below.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil

import numpy as np
import pytest
from conftest import (
    assert_multi_process_gives_the_same_bytes,
    load_info,
    read_rejects,
    read_split,
    run_convert,
)
from PIL import Image, ImageEnhance

from convert_core.options import ConvertOptions, UserError
from evenshard import cli
from tests import near_embeddings

PICTURES = 10
WITH_COPIES = 5
COPIES = ("half", "double", "q60", "bright")
HISTOGRAM = "tests.near_embeddings:histogram"
BATCHED = "tests.near_embeddings:histograms"
THRESHOLD = "0.9"


def picture(rng: np.random.Generator) -> Image.Image:
    """Blocks of three colours of the picture's own (each channel near the middle of one
    of the histogram's levels: a copy's small changes keep its bins), a little noise."""
    palette = 32 + 64 * rng.integers(0, 4, size=(3, 3)) + rng.integers(-8, 9, size=(3, 3))
    cells = rng.integers(0, 3, size=(6, 8))
    pixels = palette[np.kron(cells, np.ones((16, 16), dtype=np.int64))]
    pixels = pixels + rng.integers(-6, 7, size=pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def _jpeg(im: Image.Image, quality: int = 92) -> bytes:
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality)
    return out.getvalue()


def copies(im: Image.Image) -> dict[str, bytes]:
    w, h = im.size
    return {
        "half": _jpeg(im.resize((w // 2, h // 2), Image.BILINEAR)),
        "double": _jpeg(im.resize((w * 2, h * 2), Image.BICUBIC)),
        "q60": _jpeg(im, 60),
        "bright": _jpeg(ImageEnhance.Brightness(im).enhance(1.04)),
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The folder, and the truth: key -> the picture it shows."""
    root = tmp_path_factory.mktemp("embedding") / "images"
    (root / "x").mkdir(parents=True)
    rng = np.random.default_rng(55)
    truth = {}
    for i in range(PICTURES):
        im = picture(rng)
        (root / "x" / f"pic{i:02d}.jpg").write_bytes(_jpeg(im))
        truth[f"x/pic{i:02d}.jpg"] = i
        if i < WITH_COPIES:
            for name, data in copies(im).items():
                (root / "x" / f"{name}{i:02d}.jpg").write_bytes(data)
                truth[f"x/{name}{i:02d}.jpg"] = i
    return str(root), truth


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def embedded(root: str) -> dict[str, np.ndarray]:
    """key -> the histogram of the image as decoded whole (no convert code)."""
    return {
        f"x/{name}": near_embeddings.histogram(
            np.asarray(Image.open(os.path.join(root, "x", name)).convert("RGB"))
        )
        for name in sorted(os.listdir(os.path.join(root, "x")))
    }


def test_the_corpus_copies_are_close_and_pictures_far(corpus):
    root, truth = corpus
    vectors = embedded(root)
    for a in vectors:
        for b in vectors:
            c = cosine(vectors[a], vectors[b])
            if truth[a] == truth[b]:
                assert c > 0.93, (a, b, c)
            else:
                assert c < 0.8, (a, b, c)


def split_of_keys(out: str) -> dict[str, str]:
    info = load_info(out)
    return {
        r["image/key"].decode(): split
        for split in info["splits"]
        for shard in read_split(out, split)
        for r in shard
    }


def digest(out: str) -> str:
    """The shards, their fingerprint files and dataset_info.json, hashed together."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(out)):
        if name.endswith((".tfrecord", ".near")) or name == "dataset_info.json":
            with open(os.path.join(out, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


FLAGS = ("--dedupe=near", f"--near_embedding={HISTOGRAM}", f"--near_threshold={THRESHOLD}")


@pytest.fixture(scope="module")
def grouped(corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("grouped"))
    return run_convert(corpus[0], out, *FLAGS, "--splits=a=0.5,b=0.5"), out


def test_copies_of_a_picture_land_in_one_split_and_pictures_separate(corpus, grouped):
    _, truth = corpus
    info, out = grouped
    where = split_of_keys(out)
    assert sorted(where) == sorted(truth)
    for i in range(WITH_COPIES):
        assert len({where[k] for k, s in truth.items() if s == i}) == 1, i
    found = info["near_duplicates"]
    assert found["embedding"] == HISTOGRAM
    assert found["threshold"] == float(THRESHOLD)
    assert found["clusters"] == WITH_COPIES  # one a picture with copies; none joins two
    assert found["inputs_in_clusters"] == WITH_COPIES * (1 + len(COPIES))
    assert found["largest_cluster"] == 1 + len(COPIES)
    assert len(set(where.values())) == 2  # the pictures are spread, not one cluster


def test_keep_one_keeps_one_image_a_cluster(corpus, tmp_path):
    _, truth = corpus
    out = str(tmp_path / "one")
    info = run_convert(corpus[0], out, *FLAGS, "--near_keep=one", "--max_reject_fraction=1")
    rejects = read_rejects(out)
    assert len(rejects) == WITH_COPIES * len(COPIES)
    for r in rejects:
        assert r["reason"] == "near_duplicate"
        kept = min(k for k, s in truth.items() if s == truth[r["key"]])
        assert r["detail"] == f"in the cluster of near-duplicates of {kept}, which is kept"
    assert sum(s["num_examples"] for s in info["splits"].values()) == PICTURES
    assert info["near_duplicates"]["rejected"] == len(rejects)


def test_the_same_bytes_run_after_run_and_batched_or_not(corpus, grouped, tmp_path):
    again = str(tmp_path / "again")
    run_convert(corpus[0], again, *FLAGS, "--splits=a=0.5,b=0.5")
    assert digest(again) == digest(grouped[1])
    batched = str(tmp_path / "batched")
    flags = [f.replace(HISTOGRAM, BATCHED) for f in FLAGS]
    info = run_convert(corpus[0], batched, *flags, "--splits=a=0.5,b=0.5")
    assert info["near_duplicates"]["embedding"] == BATCHED
    shards = [n for n in os.listdir(batched) if n.endswith((".tfrecord", ".near"))]
    assert shards
    for name in shards:  # dataset_info names the function: the shards are alike
        with (
            open(os.path.join(batched, name), "rb") as a,
            open(os.path.join(grouped[1], name), "rb") as b,
        ):
            assert a.read() == b.read(), name


@pytest.mark.slow
def test_the_same_bytes_with_two_worker_processes(corpus, tmp_path):
    assert_multi_process_gives_the_same_bytes(corpus[0], tmp_path, *FLAGS, "--splits=a=0.5,b=0.5")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"near_embedding": HISTOGRAM}, "--near_embedding applies to --dedupe near only"),
        ({"near_threshold": 0.8}, "--near_threshold applies to --near_embedding only"),
        (
            {"dedupe": "near", "near_embedding": HISTOGRAM, "near_threshold": 0.0},
            "--near_threshold must be a cosine similarity in (0, 1], got 0.0",
        ),
        (
            {"dedupe": "near", "near_embedding": HISTOGRAM, "near_threshold": 1.5},
            "--near_threshold must be a cosine similarity in (0, 1], got 1.5",
        ),
        (
            {"dedupe": "near", "near_embedding": HISTOGRAM, "near_distance": 4},
            "--near_distance applies to the perceptual hash, not to --near_embedding",
        ),
        ({"dedupe": "near", "near_embedding": "histogram"}, "expected MODULE:FUNCTION"),
        (
            {"dedupe": "near", "near_embedding": "tests.no_such_module:f"},
            "--near_embedding tests.no_such_module:f: module tests.no_such_module cannot be "
            "imported (ModuleNotFoundError",
        ),
        (
            {"dedupe": "near", "near_embedding": "tests.near_embeddings:nothing"},
            "module tests.near_embeddings has no attribute nothing",
        ),
        (
            {"dedupe": "near", "near_embedding": "tests.near_embeddings:NOT_A_FUNCTION"},
            "tests.near_embeddings:NOT_A_FUNCTION is not callable (an int)",
        ),
    ],
)
def test_embedding_flags_are_checked_at_once_in_one_line(flags, message):
    with pytest.raises(UserError) as e:
        ConvertOptions(input="in", output_dir="out", **flags)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_function_that_gives_no_vector_stops_the_run_naming_the_image(corpus, tmp_path):
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:flat")
    with pytest.raises(Exception, match=r"tests.near_embeddings:flat gave .*x/\w+\.jpg"):
        run_convert(corpus[0], str(tmp_path / "flat"), *flags)


@pytest.mark.parametrize(
    "runner",
    [(), ("--direct_running_mode=multi_processing", "--direct_num_workers=2")],
    ids=["in_process", "two_worker_processes"],
)
def test_the_command_says_a_functions_bad_output_in_one_line(corpus, tmp_path, capsys, runner):
    """Raised in a step, the error came out as Beam's traceback of 157 lines, the message
    at its end with the step's name after it."""
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:flat")
    args = ["convert", f"--input={corpus[0]}", f"--output_dir={tmp_path / 'out'}"]
    assert cli.main([*args, *flags, *runner]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        r"evenshard convert: error: --near_embedding tests.near_embeddings:flat gave shape "
        r"\(2, 2\) for x/\w+\.jpg: it must return a 1-D vector of finite floats, the same "
        r"length for every image",
        err[-1],
    ), err[-1]
    assert "Traceback" not in "\n".join(err)


def test_vectors_all_alike_are_one_cluster_not_a_division_by_zero(corpus, tmp_path):
    """Centred on the run's mean, vectors that all point one way are about zero, and
    sizing the bands divided by zero (a user's trial: 112 lines of traceback)."""
    from schemas import near_embedding as ne

    assert ne.bands_for(-1.0) == ne.MAX_BANDS
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:alike")
    info = run_convert(corpus[0], str(tmp_path / "alike"), *flags)
    found = info["near_duplicates"]
    assert found["clusters"] == 1 and found["largest_cluster"] == found["inputs_in_clusters"]


def test_a_function_that_raises_is_one_line_naming_it_and_the_image(corpus, tmp_path, capsys):
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:raising")
    args = ["convert", f"--input={corpus[0]}", f"--output_dir={tmp_path / 'out'}", *flags]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        r"evenshard convert: error: --near_embedding tests.near_embeddings:raising raised "
        r"RuntimeError for x/\w+\.jpg: model exploded",
        err[-1],
    ), err[-1]


def test_vectors_of_two_lengths_stop_the_run_naming_an_image_of_each(tmp_path):
    """Lengths were compared only where two vectors met in a band: a run whose vectors
    differed was written, and leaks refused it later."""
    root = tmp_path / "in" / "x"
    root.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for i in range(6):
        pixels = rng.integers(0, 200, (24, 24, 3), dtype=np.uint8)
        if i == 4:
            pixels[0, 0] = 255  # the one image one_longer lengthens
        Image.fromarray(pixels).save(root / f"p{i}.png")
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:one_longer")
    with pytest.raises(
        Exception, match=r"gave vectors of 64 values \(x/p\d\.png\) and of 65 \(x/p4\.png\)"
    ):
        run_convert(str(tmp_path / "in"), str(tmp_path / "out"), *flags, "--splits=train=1")


def test_a_batched_function_that_returns_a_generator_is_said_in_one_line(corpus, tmp_path):
    flags = ("--dedupe=near", "--near_embedding=tests.near_embeddings:generated")
    with pytest.raises(
        Exception, match=r"tests.near_embeddings:generated gave a generator .* one row an image"
    ):
        run_convert(corpus[0], str(tmp_path / "gen"), *flags)


def test_leaks_finds_the_copies_by_the_rule_convert_used(corpus, grouped, tmp_path, capsys):
    """A set of copies converted apart from their pictures: the audit, reading the rule
    and the vectors from the datasets, finds each copy's picture across, as a brute
    force over the histograms does."""
    root, truth = corpus
    mine = tmp_path / "mine"
    (mine / "y").mkdir(parents=True)
    rng = np.random.default_rng(7)
    for i in (0, 1, 2):  # re-encoded pictures, and two unrelated ones
        Image.open(os.path.join(root, f"x/pic{i:02d}.jpg")).save(
            mine / "y" / f"m{i}.jpg", quality=70
        )
    for i in (0, 1):
        (mine / "y" / f"other{i}.jpg").write_bytes(_jpeg(picture(rng)))
    other = str(tmp_path / "mine_out")
    run_convert(str(mine), other, *FLAGS, "--splits=test=1")
    mine_vectors = {
        f"y/{n}": near_embeddings.histogram(np.asarray(Image.open(mine / "y" / n).convert("RGB")))
        for n in os.listdir(mine / "y")
    }
    theirs = embedded(root)
    expected = {
        k for k, v in mine_vectors.items() if any(cosine(v, w) >= 0.9 for w in theirs.values())
    }
    assert expected == {"y/m0.jpg", "y/m1.jpg", "y/m2.jpg"}
    assert cli.main(["leaks", grouped[1], other, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["rule"] == {"embedding": HISTOGRAM, "threshold": float(THRESHOLD)}
    assert report["fingerprints"] == "stored"
    assert report["leaked_images"] == len(expected)
    assert report["beyond_convert_rule"] == 0
    found = {p["a"]["key"] for p in report["closest"]} | {p["b"]["key"] for p in report["closest"]}
    assert expected <= found
    for p in report["closest"]:
        assert p["grouped_by_convert_rule"]
        assert truth.get(p["a"]["key"], truth.get(p["b"]["key"])) is not None


def test_within_one_dataset_no_cluster_leaks(grouped, capsys):
    assert cli.main(["leaks", grouped[1], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["leaked_images"] == 0


def test_the_bands_are_taken_from_the_runs_centre():
    """A model's vectors share a component: against hyperplanes through the origin their
    signs agree, and the bands compared a large share of all pairs (a review's
    simulation of CLIP-like vectors: 17.5 %); from the run's mean vector, few. The
    centre is integers, the same whatever order the vectors come in."""
    from schemas import near_embedding as ne

    rng = np.random.default_rng(0)
    shared = rng.normal(size=128)
    raw = shared + 0.8 * rng.normal(size=(1500, 128))  # unrelated: cosine about 0.6
    stored = np.stack([ne.quantised(v, "t", str(i)) for i, v in enumerate(raw)])
    vectors = stored.astype(np.float64)
    ints = stored.astype(np.int64)
    total, count, squares = ints.sum(axis=0), len(stored), int((ints * ints).sum())
    centre = ne.centre_of(total, count, squares)
    assert centre == ne.centre_of(ints[::-1].sum(axis=0), count, squares)
    assert 0.4 < centre["shared"] < 0.8, centre["shared"]
    plain, centred = ne.EmbeddingRule(0.95), ne.EmbeddingRule(0.95, centre)
    assert centred.bands > plain.bands  # sized for the pairs' cosine from the centre
    pairs = count * (count - 1) / 2
    share = len(ne.candidate_pairs(vectors, plain.bands)) / pairs
    share_centred = len(ne.candidate_pairs(vectors, centred.bands, centre)) / pairs
    assert share > 0.05 and share_centred < 0.03, (share, share_centred)
    # pairs at the threshold, taken from the same picture: found from the centre
    found = 0
    for i in range(200):
        copy = raw[i] + 0.17 * rng.normal(size=128)
        both = np.stack([stored[i], ne.quantised(copy, "t", "c")]).astype(np.float64)
        if ne.cosines(both[:1], both[1:])[0, 0] >= 0.95:
            found += ne.candidate_pairs(both, centred.bands, centre) == [(0, 1)]
            found -= 1000 * (ne.candidate_pairs(both, centred.bands, centre) != [(0, 1)])
    assert found > 20, found  # (a miss would weigh -1000)


def test_leaks_says_the_model_it_cannot_import_comes_from_the_dataset(grouped, tmp_path, capsys):
    """leaks has no --near_embedding flag: a model it cannot import is named as the one the
    dataset was converted with (its dataset_info.json), in one line, exit 2."""
    moved = tmp_path / "moved"
    shutil.copytree(grouped[1], moved)
    info = json.loads((moved / "dataset_info.json").read_text())
    info["near_duplicates"]["embedding"] = "no_such_module_here:embed"
    (moved / "dataset_info.json").write_text(json.dumps(info))
    plain = tmp_path / "plain"
    shutil.copytree(grouped[1], plain)
    for near_file in plain.glob("*.near"):
        near_file.unlink()  # no stored vectors: leaks embeds the images itself
    assert cli.main(["leaks", str(moved), str(plain)]) == 2
    said = capsys.readouterr().err
    assert "no_such_module_here" in said and "dataset_info.json" in said
    assert len(said.strip().splitlines()) == 1


def test_pair_weights_are_the_weights_of_the_pairs_cosines():
    """The star clusters' nearest centre weighs a pair as the buckets do."""
    from schemas import near_embedding

    rng = np.random.default_rng(9)
    vectors = near_embedding.parse_many(
        [rng.integers(-127, 128, 48, dtype=np.int8).tobytes() for _ in range(30)]
    )
    a, b = rng.integers(0, 30, 200), rng.integers(0, 30, 200)
    rule = near_embedding.EmbeddingRule(0.9)
    whole = near_embedding.cosines(vectors, vectors)
    assert (rule.pair_weights(a, b, vectors) == rule.weights(whole[a, b])).all()
