"""convert --dedupe near and evenshard leaks: near-duplicates never span two splits.

The corpus: photo-like sources (noise at every scale, as a photo's spectrum)
and, for some of them, the variants a real collection holds: resized x0.5
and x2, re-encoded at JPEG quality 60, cut 5 % at one edge, brightened 10 %,
converted to PNG, and a byte-identical copy under another label. The real-
photo precision/recall curve is benchmarks/near_bench.py's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import load_info, read_rejects, read_split, run_convert, write_manifest
from PIL import Image, ImageEnhance

from audit import leaks
from audit import sheet as sheet_module
from convert_core.options import ConvertOptions, UserError
from evenshard import cli, convert_command
from evenshard.synthetic import photo_bytes
from schemas import images, near, near_pairs
from schemas.dataset_info import DatasetInfo
from schemas.images import inspect_stream

SOURCES = 24
WITH_VARIANTS = 8
VARIANTS = ("half", "double", "q60", "cut", "bright", "png", "copy")
LABELS = ("cat", "dog", "fox")


def _encoded(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def variants(data: bytes, i: int) -> dict[str, tuple[str, bytes]]:
    """name -> (extension, bytes) of each variant of one source."""
    im = Image.open(io.BytesIO(data))
    w, h = im.size
    cut = [(w // 20, 0, w, h), (0, 0, w - w // 20, h), (0, h // 20, w, h), (0, 0, w, h - h // 20)]
    return {
        "half": (".jpg", _encoded(im.resize((w // 2, h // 2), Image.BILINEAR), quality=90)),
        "double": (".jpg", _encoded(im.resize((w * 2, h * 2), Image.BICUBIC), quality=90)),
        "q60": (".jpg", _encoded(im, quality=60)),
        "cut": (".jpg", _encoded(im.crop(cut[i % 4]), quality=90)),
        "bright": (".jpg", _encoded(ImageEnhance.Brightness(im).enhance(1.1), quality=90)),
        "png": (".png", _encoded(im, "PNG")),
        "copy": (".jpg", data),
    }


@pytest.mark.fast
def test_candidate_pairs_are_every_pair_within_the_distance():
    """``candidate_pairs`` (what ``evenshard leaks`` compares: one band at a time, in
    arrays) finds exactly the pairs a comparison of every pair finds: hashes within the
    distance, the weak bits of either left out; clusters of copies and strangers."""
    rng = np.random.default_rng(1)
    thumb = np.zeros(76, dtype=np.int16)
    fps = []
    for _ in range(120):  # 120 pictures, up to 8 copies each, a few bits flipped
        value = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
        for _ in range(int(rng.integers(1, 9))):
            copy = value
            for bit in rng.choice(64, size=int(rng.integers(0, 9)), replace=False):
                copy ^= 1 << int(bit)
            weak = sum(1 << int(x) for x in rng.choice(63, size=near.WEAK, replace=False))
            fps.append(near.Parsed(copy, weak, 20, thumb))
    for distance in (0, 4, 10):
        every = [
            (i, j)
            for i in range(len(fps))
            for j in range(i + 1, len(fps))
            if near.apart(fps[i], fps[j], distance) <= distance
        ]
        assert near_pairs.candidate_pairs(fps, distance) == every, distance
        assert distance < 10 or len(every) > len(fps)  # copies found: no empty agreement


def _copies_of_pictures(rng, pictures: int = 100, copies: int = 3) -> list[bytes]:
    """Fingerprints' bytes: each picture's copies a few bits apart, one thumbnail each."""
    raws = []
    for _ in range(pictures):
        value = int(rng.integers(0, 2**64, dtype=np.uint64))
        base = rng.integers(0, 256, 77).astype(np.uint8).tobytes()
        for _ in range(copies):
            copy = value ^ sum(1 << int(b) for b in rng.choice(64, 3, replace=False))
            weak = sum(1 << int(x) for x in rng.choice(63, size=near.WEAK, replace=False))
            raws.append(copy.to_bytes(8, "big") + weak.to_bytes(8, "big") + base)
    return raws


@pytest.mark.fast
def test_the_table_and_the_shuffle_give_the_same_edges():
    """``near_buckets``: the table's parts (the hash's way) and a grouping of each
    image's band values (the shuffle, the embedding's way) give the same edges, with
    identical fingerprints under two keys and given splits among them."""
    from beam_jobs import near_buckets

    raws = _copies_of_pictures(np.random.default_rng(4), pictures=60)
    raws += raws[:20]  # the same fingerprints again, under other keys
    members = [(f"k{n:04d}", raw, "val" if n % 17 == 0 else None) for n, raw in enumerate(raws)]
    table = near_buckets.table_of(list(reversed(members)))
    for distance in (2, 10):
        rule = near_pairs.HashRule(distance)
        grouped: dict = {}
        for m in members:
            for band in rule.bands_of(m[1]):
                grouped.setdefault(band, []).append(m)
        shuffled = sorted(
            e for item in grouped.items() for e in near_buckets.bucket_edges(item, rule)
        )
        parts = near_buckets.TABLE_PARTS
        tabled = sorted(
            e for p in range(parts) for e in near_buckets.part_edges(p, table, rule, parts)
        )
        assert tabled == shuffled and len(tabled) > len(raws) // 3, distance


@pytest.mark.fast
def test_the_tables_buckets_are_the_band_values_each_fingerprint_has():
    """``HashRule.buckets`` (the buckets ``--dedupe near`` finds in its table of every
    fingerprint, dealt to parts) are the groups of the band values :func:`bands` gives
    each fingerprint, its weak bits' settings included: every part together, each
    bucket in one part, the owners ascending."""
    raws = _copies_of_pictures(np.random.default_rng(2))
    for distance in (4, 10):
        rule = near_pairs.HashRule(distance)
        expected: dict = {}
        for owner, raw in enumerate(raws):
            for band in rule.bands_of(raw):
                expected.setdefault(band, []).append(owner)
        expected = {k: v for k, v in expected.items() if len(v) > 1}
        parsed = rule.parse_many(b"".join(raws))
        for parts in (3 * (distance + 1) + 2, 3, 1):  # 3 a band and 2 with none; 3 bands a part
            found = {}
            for part in range(parts):
                for band, value, owners in rule.buckets(parsed, part, parts):
                    assert (band, value) not in found  # in one part only
                    found[band, value] = owners.tolist()
            assert found == expected and len(found) > 3 * distance, parts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The folder, and the truth: key -> the source it comes from."""
    root = str(tmp_path_factory.mktemp("near") / "images")
    rng = np.random.default_rng(5)
    truth = {}

    def put(label: str, name: str, data: bytes, source: int) -> None:
        os.makedirs(os.path.join(root, label), exist_ok=True)
        with open(os.path.join(root, label, name), "wb") as f:
            f.write(data)
        truth[f"{label}/{name}"] = source

    for i in range(SOURCES):
        data = photo_bytes(rng, 96, 128)
        label = LABELS[i % 3]
        put(label, f"src{i:02d}.jpg", data, i)
        if i < WITH_VARIANTS:
            for name, (ext, v) in variants(data, i).items():
                # the copy is renamed into another label's folder
                where = LABELS[(i + 1) % 3] if name == "copy" else label
                put(where, f"{name}{i:02d}{ext}", v, i)
    return root, truth


def fingerprint_of(path: str) -> int:
    with open(path, "rb") as f:
        data = f.read()
    *_, value = inspect_stream(io.BytesIO(data), len(data), full=True, max_pixels=10**9, near=True)
    return near.to_int(value)


def test_variants_are_within_the_default_distance_and_sources_far_apart(corpus):
    root, truth = corpus
    values = {key: fingerprint_of(os.path.join(root, key)) for key in truth}
    for key, source in truth.items():
        src = values[f"{LABELS[source % 3]}/src{source:02d}.jpg"]
        bits = bin(values[key] ^ src).count("1")
        assert bits <= near.DEFAULT_DISTANCE, (key, bits)
    sources = [v for k, v in values.items() if "/src" in k]
    apart = [bin(a ^ b).count("1") for i, a in enumerate(sources) for b in sources[i + 1 :]]
    assert min(apart) > near.DEFAULT_DISTANCE


def test_fingerprints_are_fixed_bits():
    # the DCT is integer arithmetic: the same bits on every machine; pinned here
    noise = np.random.default_rng(0).integers(0, 256, (48, 64), dtype=np.uint8)
    gray = Image.fromarray(noise, "L")
    assert near.fingerprint(gray)[:16] == "8b0b24f6f04e91be"
    assert len(near.fingerprint(gray)) == near.FINGERPRINT_CHARS
    assert near.fingerprint(gray.convert("RGB")) == near.fingerprint(gray)
    ramp = Image.fromarray(np.tile(np.arange(64, dtype=np.uint8) * 4, (48, 1)), "L")
    assert near.fingerprint(ramp)[:16] == "8000000000000000"  # the DC alone above the median
    wide = Image.fromarray(noise.astype(np.uint16) * 257)  # 16-bit: scaled to 8 bits first
    assert near.fingerprint(wide) == near.fingerprint(gray)


@pytest.mark.parametrize(
    "mode, options",
    [
        ("RGB", {}),
        ("RGB", {"progressive": True}),
        ("RGB", {"subsampling": 0}),
        ("L", {}),
        ("CMYK", {}),  # decoded by Pillow (libjpeg-turbo gives no RGB of it)
    ],
)
def test_a_jpeg_is_fingerprinted_from_the_pixels_pillows_decode_gives(mode, options):
    """A clean JPEG is decoded by libjpeg-turbo at the draft's DCT scale: its fingerprint
    and the embedding's pixels are those of Pillow's own decode at that scale."""
    photo = Image.open(io.BytesIO(photo_bytes(np.random.default_rng(7), 150, 200))).convert(mode)
    data = _encoded(photo, **options)
    for side, pixels in ((64, False), (images.EMBEDDING_SIDE, True)):
        pillows = Image.open(io.BytesIO(data))
        w, h = pillows.size
        pillows.draft(None, (max(min(w, side), w // 8), max(min(h, side), h // 8)))
        pillows.load()
        found = inspect_stream(
            io.BytesIO(data), len(data), full=True, max_pixels=1 << 30, near=True, pixels=pixels
        )[4]
        if pixels:
            assert np.array_equal(found, np.asarray(near.composited(pillows)))
        else:
            assert found == near.fingerprint(pillows)
    decoded = images._decoded_cleanly_at_draft(io.BytesIO(data), Image.open(io.BytesIO(data)))
    assert (decoded is None) == (mode == "CMYK")


def test_bands_meet_for_every_pair_within_the_distance():
    """Weak bits left out: the pair still shares a band value (each image is in the band
    under every setting of its weak bits there)."""
    rng = np.random.default_rng(0)
    thumb = np.zeros(76, dtype=np.int16)
    for distance in (0, 3, 10, 20):
        for _ in range(200):
            a = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
            weak_a, weak_b = (
                sum(1 << int(x) for x in rng.choice(63, size=near.WEAK, replace=False))
                for _ in "ab"
            )
            loose = near.weak_bits(weak_a, distance) | near.weak_bits(weak_b, distance)
            b = a ^ (loose & int(rng.integers(0, 2**63)))  # any setting of the weak bits
            flips = rng.choice(64, size=int(rng.integers(0, distance + 1)), replace=False)
            for bit in flips:
                b ^= 1 << int(bit)
            pa, pb = near.Parsed(a, weak_a, 20, thumb), near.Parsed(b, weak_b, 20, thumb)
            assert near.apart(pa, pb, distance) <= distance
            assert set(near_pairs.bands(pa, distance)) & set(near_pairs.bands(pb, distance))
            assert near_pairs.candidate_pairs([pa, pb], distance) == [(0, 1)]


def _weak_bits_by_the_rule(weak: int, distance: int) -> int:
    """weak_bits written as its rule says: each band's lowest WEAK_A_BAND weak bits."""
    out = 0
    for bits in near.band_bits(distance):
        for b in [b for b in bits if weak >> b & 1][: near.WEAK_A_BAND]:
            out |= 1 << b
    return out


def _bands_by_the_rule(fp: near.Parsed, distance: int) -> list:
    """bands written as its rule says, a bit at a time."""
    weak, out = _weak_bits_by_the_rule(fp.weak, distance), []
    for i, bits in enumerate(near.band_bits(distance)):
        base = sum(((fp.value >> b) & 1) << k for k, b in enumerate(bits))
        loose = [k for k, b in enumerate(bits) if weak >> b & 1]
        for setting in range(1 << len(loose)):
            value = base
            for n, k in enumerate(loose):
                value = value & ~(1 << k) | ((setting >> n) & 1) << k
            out.append((i, value))
    return out


def test_the_fast_band_and_pair_code_gives_what_the_rules_say():
    """The byte tables of bands, the weak bits of one and of many, and the pairs within
    the distance, against the rules written out bit by bit (the same values, in the
    same order: the buckets, and so the shards, stay as they were)."""
    rng = np.random.default_rng(7)
    for distance in (0, 1, 4, 10, 14, 20):
        values = [int(v) for v in rng.integers(0, 2**63, 300)]
        values = [v * 2 + int(rng.integers(0, 2)) for v in values]  # bit 63 too
        weaks = [
            sum(
                1 << int(x)
                for x in rng.choice(64, size=int(rng.choice([0, 3, 8, 20])), replace=False)
            )
            for _ in values
        ]
        fps = [near.Parsed(v, w, 20, None) for v, w in zip(values, weaks)]
        assert [near.weak_bits(w, distance) for w in weaks] == [
            _weak_bits_by_the_rule(w, distance) for w in weaks
        ]
        many = near_pairs.weak_bits_many(np.array(weaks, dtype=np.uint64), distance)
        assert many.tolist() == [_weak_bits_by_the_rule(w, distance) for w in weaks]
        assert all(near_pairs.bands(fp, distance) == _bands_by_the_rule(fp, distance) for fp in fps)
        hashes = np.array(values, dtype=np.uint64)
        i, j, bits = near_pairs.close_pairs(hashes, distance + 12, many)
        expected = [
            (a, b, (((values[a] ^ values[b]) & ~(int(many[a]) | int(many[b]))).bit_count()))
            for a in range(len(values))
            for b in range(a + 1, len(values))
        ]
        expected = [e for e in expected if e[2] <= distance + 12]
        assert list(zip(i.tolist(), j.tolist(), bits.tolist())) == expected


def _thumbs_apart_by_the_rule(ta, tb, qa, qb, bits, slack) -> int:
    """thumbs_apart of one pair written as its docstring says, in Python integers."""
    d = [int(x) - int(y) for x, y in zip(ta[:64], tb[:64])]
    gray = sum(abs(x - sum(d) // 64) for x in d) // 64
    c = [int(x) - int(y) for x, y in zip(ta[64:], tb[64:])]
    colour = sum(abs(x - sum(c) // 12) for x in c) // 12
    cells = [ta[64:], tb[64:]]
    spans = [max(max(t[k : k + 3]) - min(t[k : k + 3]) for k in (0, 3, 6, 9)) for t in cells]
    coloured = min(spans) > 2
    if gray > near.GRAY_APART * slack or (coloured and colour > near.COLOUR_APART * slack):
        return -1
    if min(qa, qb) < near.QUALITY_GATE:  # flat: close in bits and in levels, means on ...
        level = sum(abs(x) for x in d) // 64
        shapes = [
            sum(abs(64 * int(x) - sum(map(int, t[:64]))) for x in t[:64]) // 4096 for t in (ta, tb)
        ]
        if min(shapes) >= near.FLAT_SHAPE:  # ... or off where both show a shape
            level = min(level, gray)
        if bits > near.FLAT_DISTANCE * slack or level > near.FLAT_GRAY_APART * slack:
            return -1
    return gray


def test_the_thumbnails_are_compared_as_the_rule_says():
    """thumbs_apart's arrays (int16, the colours and the flat rule only where the gray is
    alike) against the rule one pair at a time: gray and coloured thumbnails, flat ones,
    brightened copies, the audit's slack."""
    rng = np.random.default_rng(3)
    n = 4000
    ta = rng.integers(0, 256, (n, 76)).astype(np.int16)
    spread = np.repeat([40, 18, 8, 4], n // 4)[:, None]  # brightened copies .. near copies
    shift, noise = rng.integers(-40, 41, (n, 1)) * (spread > 6), rng.integers(-18, 19, (n, 76))
    tb = np.clip(ta + shift + noise * spread // 18, 0, 255)
    tb = tb.astype(np.int16)
    tb[: n // 4, 64:] = tb[: n // 4, 64:68].repeat(3, axis=1)[:, :12]  # gray colours
    ta[n // 8 : n // 4, 64:] = 100  # gray colours on both sides
    low = slice(n // 2, 3 * n // 4)  # nearly plain thumbnails: shapes about FLAT_SHAPE
    ta[low, :64] = 100 + rng.integers(-12, 13, (n // 4, 64))
    tb[low, :64] = np.clip(ta[low, :64] + rng.integers(-8, 9, (n // 4, 1)), 0, 255)
    tb[low, :64] += rng.integers(-2, 3, (n // 4, 64)).astype(np.int16)
    qa, qb = rng.integers(0, 12, n), rng.integers(0, 12, n)
    bits = rng.integers(0, 12, n)
    for slack in (1.0, near.AUDIT_SLACK):
        found = near.thumbs_apart(ta, tb, qa, qb, bits, slack)
        expected = [
            _thumbs_apart_by_the_rule(ta[k], tb[k], qa[k], qb[k], bits[k], slack) for k in range(n)
        ]
        assert found.tolist() == expected
        assert 0.1 < (found >= 0).mean() < 0.9  # both verdicts are tested
        shaped = np.minimum(near.shape(ta), near.shape(tb)) >= near.FLAT_SHAPE
        flat = np.minimum(qa, qb) < near.QUALITY_GATE
        for kind in (shaped & flat, ~shaped & flat):  # the flat rule's two ways
            assert 0 < (found[kind] >= 0).mean() < 1


@pytest.fixture(scope="module")
def grouped(corpus, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("grouped"))
    return run_convert(corpus[0], out, "--dedupe=near", "--splits=a=0.4,b=0.3,c=0.3"), out


def split_of_keys(out: str) -> dict[str, str]:
    info = load_info(out)
    return {
        r["image/key"].decode(): split
        for split in info["splits"]
        for shard in read_split(out, split)
        for r in shard
    }


def test_a_cluster_never_spans_two_splits(corpus, grouped, capsys):
    _, truth = corpus
    near_keys = [k for k, s in truth.items() if s < WITH_VARIANTS]
    info, out = grouped
    where = split_of_keys(out)
    assert len(where) == len(truth)  # nothing lost
    for source in range(WITH_VARIANTS):
        assert len({where[k] for k, s in truth.items() if s == source}) == 1, source
    assert info["near_duplicates"] == {
        "clusters": WITH_VARIANTS,
        "distance": near.DEFAULT_DISTANCE,
        "given_two_splits": 0,
        "inputs_in_clusters": WITH_VARIANTS * (1 + len(VARIANTS)),
        "keep": "all",
        "largest_cluster": 1 + len(VARIANTS),
        "components": WITH_VARIANTS,  # each source's matches: one cluster, none cut
        "components_cut": 0,
        "rejected": 0,
    }
    said = f"(within 10 bits): {WITH_VARIANTS} clusters holding {len(near_keys)} inputs"
    assert said in convert_command.summary(DatasetInfo.of(info), out, 1.0)
    assert cli.main(["inspect", out]) == 0
    assert said in capsys.readouterr().out


def test_fingerprints_lie_beside_each_shard_in_record_order(corpus, grouped):
    root, _ = corpus
    info, out = grouped
    for split in info["splits"]:
        for shard, records in zip(info["splits"][split]["shards"], read_split(out, split)):
            with open(os.path.join(out, shard["near"]), "rb") as f:
                lines = near.parse_sidecar(f.read())
            assert [k for k, _ in lines] == [r["image/key"].decode() for r in records]
            for key, value in lines:
                assert near.to_int(value) == fingerprint_of(os.path.join(root, key))


def test_without_near_the_variants_leak_and_the_audit_says_so(corpus, grouped, tmp_path, capsys):
    _, truth = corpus
    plain = str(tmp_path / "plain")
    run_convert(corpus[0], plain, "--splits=a=0.4,b=0.3,c=0.3")
    where = split_of_keys(plain)
    truly = sum(
        1
        for key, split in where.items()
        if any(where[k] != split for k, s in truth.items() if s == truth[key] and k != key)
    )
    assert truly > 0  # the hash of the key scatters a source's copies over the splits
    sheet = str(tmp_path / "sheet.png")
    assert cli.main(["leaks", plain, "--sheet", sheet, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["fingerprints"] == "computed"  # no .near files: decoded by the audit
    assert report["leaked_images"] == truly
    assert report["closest"][0]["bits"] == 0  # the byte-identical copy, or a resize of it
    assert Image.open(sheet).size[1] > 128
    # the dataset made with --dedupe near: no leak, from the stored fingerprints
    assert cli.main(["leaks", grouped[1], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["fingerprints"], report["leaked_images"]) == ("stored", 0)
    # computed from the records equals stored at convert
    assert sorted(zip(leaks.Side(plain).keys, leaks.Side(plain).values)) == sorted(
        zip(leaks.Side(grouped[1]).keys, leaks.Side(grouped[1]).values)
    )
    assert cli.main(["leaks", plain, f"--max_leaked={truly}"]) == 0  # the CI gate's threshold
    # an audit narrower than convert's rule: convert's rule, and so the gate, unchanged
    capsys.readouterr()
    said = {}
    for distance in (0, 4, 14):
        assert cli.main(["leaks", plain, f"--distance={distance}", "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["convert_distance"] == near.DEFAULT_DISTANCE
        said[distance] = report["leaked_images"] - report["beyond_convert_rule"]
    assert said[0] == said[4] == said[14] > 0


def test_a_test_set_of_ones_own_against_a_training_set(corpus, grouped, tmp_path, capsys):
    root, truth = corpus
    mine = tmp_path / "mine"
    (mine / "x").mkdir(parents=True)
    for i in (0, 1):  # two re-encoded sources, and one unrelated photo
        Image.open(os.path.join(root, f"{LABELS[i % 3]}/src{i:02d}.jpg")).save(
            mine / "x" / f"mine{i}.jpg", quality=70
        )
    (mine / "x" / "other.jpg").write_bytes(photo_bytes(np.random.default_rng(99), 96, 128))
    other = str(tmp_path / "mine_out")
    run_convert(str(mine), other, "--splits=test=1", "--dedupe=near")
    assert cli.main(["leaks", grouped[1], other, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["leaked_images"] == 2
    assert set(report["leaked"]) == {"other:test"}
    assert sum(report["leaked"]["other:test"].values()) >= 2
    # a dataset against itself: every image its own leak; one line, exit 2
    for itself in (grouped[1], grouped[1] + "/", os.path.relpath(grouped[1])):
        assert cli.main(["leaks", grouped[1], itself]) == 2
        assert "is DATASET itself" in capsys.readouterr().err


def test_keep_one_rejects_the_rest_of_each_cluster(corpus, tmp_path):
    _, truth = corpus
    out = str(tmp_path / "one")
    info = run_convert(
        corpus[0],
        out,
        "--dedupe=near",
        "--near_keep=one",
        "--split_mode=exact",
        "--max_reject_fraction=1",
    )
    rejects = read_rejects(out)
    assert len(rejects) == WITH_VARIANTS * len(VARIANTS)
    for r in rejects:
        assert r["reason"] == "near_duplicate"
        kept = min(k for k, s in truth.items() if s == truth[r["key"]])
        assert r["detail"] == f"in the cluster of near-duplicates of {kept}, which is kept"
    assert sum(s["num_examples"] for s in info["splits"].values()) == SOURCES
    assert info["near_duplicates"]["rejected"] == len(rejects)


def test_a_split_given_in_the_manifest_still_wins(corpus, tmp_path):
    root, truth = corpus
    rows = [{"path": os.path.join(root, k), "label": k.split("/")[0], "key": k} for k in truth]
    given = {"cat/src00.jpg": "b", "cat/half00.jpg": "c", "cat/src03.jpg": "c"}
    for row in rows:
        row["split"] = given.get(row["key"], "")
    manifest = write_manifest(str(tmp_path / "m.csv"), rows, ["path", "label", "key", "split"])
    out = str(tmp_path / "m")
    info = run_convert(manifest, out, "--dedupe=near", "--splits=a=0.4,b=0.3,c=0.3")
    where = split_of_keys(out)
    assert where["cat/src00.jpg"] == "b" and where["cat/half00.jpg"] == "c"
    # the rest of source 0's cluster follows its smallest key given a split (cat/half00)
    assert {where[k] for k, s in truth.items() if s == 0} - {"b"} == {"c"}
    assert {where[k] for k, s in truth.items() if s == 3} == {"c"}
    assert info["near_duplicates"]["given_two_splits"] == 1


@pytest.mark.slow
def test_the_same_bytes_on_every_runner(corpus, grouped, dask_runner_flags, tmp_path):
    def digest(out: str) -> str:
        h = hashlib.sha256()
        for name in sorted(os.listdir(out)):
            if name.endswith((".tfrecord", ".near")) or name == "dataset_info.json":
                with open(os.path.join(out, name), "rb") as f:
                    h.update(name.encode() + f.read())
        return h.hexdigest()

    flags = ("--dedupe=near", "--splits=a=0.4,b=0.3,c=0.3")
    multi = str(tmp_path / "multi")
    run_convert(
        corpus[0],
        multi,
        *flags,
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
        validated=False,
    )
    assert digest(multi) == digest(grouped[1])
    dask = str(tmp_path / "dask")
    run_convert(corpus[0], dask, *flags, *dask_runner_flags, validated=False)
    assert digest(dask) == digest(grouped[1])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"dedupe": "near", "split_mode": "exact"}, "--split_mode=exact cannot also do"),
        ({"dedupe": "near", "near_distance": 21}, "--near_distance must be in [0, 20]"),
        ({"dedupe": "near", "near_keep": "some"}, "--near_keep: expected one of all, one"),
        ({"near_keep": "one"}, "apply to --dedupe near only"),
        ({"dedupe": "content", "near_distance": 4}, "apply to --dedupe near only"),
    ],
)
def test_near_flags_are_checked_at_once(flags, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ConvertOptions(input="in", output_dir="out", **flags)


def test_palette_one_bit_gif_and_sixteen_bit_images_are_fingerprinted(tmp_path):
    rng = np.random.default_rng(3)
    photo = Image.open(io.BytesIO(photo_bytes(rng, 150, 200)))
    folder = tmp_path / "modes" / "x"
    folder.mkdir(parents=True)
    photo.convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.png")
    photo.convert("1").save(folder / "bits.png")
    frames = [photo.convert("P"), photo.rotate(90).convert("P")]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:])
    gray16 = (np.asarray(photo.convert("L")).astype(np.uint16) * 257).astype(np.uint16)
    Image.fromarray(gray16).save(folder / "gray16.png")
    photo.save(folder / "photo.jpg", quality=90)
    out = str(tmp_path / "out")
    info = run_convert(str(tmp_path / "modes"), out, "--dedupe=near", "--splits=all=1")
    assert info["rejects"]["total"] == 0
    # all of them one picture: one cluster (the GIF by its first frame)
    assert info["near_duplicates"]["clusters"] == 1
    assert info["near_duplicates"]["inputs_in_clusters"] == 5


def test_keep_one_keeps_the_image_the_manifest_places(corpus, tmp_path):
    root, truth = corpus
    rows = [{"path": os.path.join(root, k), "label": k.split("/")[0], "key": k} for k in truth]
    for row in rows:
        row["split"] = "test" if row["key"] == "cat/q6000.jpg" else ""
    manifest = write_manifest(str(tmp_path / "m.csv"), rows, ["path", "label", "key", "split"])
    out = str(tmp_path / "m")
    run_convert(
        manifest,
        out,
        "--dedupe=near",
        "--near_keep=one",
        "--splits=train=0.5,test=0.5",
        "--max_reject_fraction=1",
    )
    where = split_of_keys(out)
    assert where["cat/q6000.jpg"] == "test"  # kept, where the manifest put it
    assert not {k for k, s in truth.items() if s == 0} - {"cat/q6000.jpg"} & set(where)


def test_a_cluster_joins_the_groups_it_touches_whole(corpus, tmp_path):
    root, truth = corpus
    # groups: source 0's variants split over g0a and g0b, each with an unrelated source;
    # g9 has no near-duplicate at all
    groups = {"cat/src00.jpg": "g0a", "cat/half00.jpg": "g0b", "dog/src10.jpg": "g0a"}
    groups.update({"fox/src11.jpg": "g0b", "cat/src09.jpg": "g9", "cat/src12.jpg": "g9"})
    rows = [
        {"path": os.path.join(root, k), "label": k.split("/")[0], "key": k, "g": groups.get(k)}
        for k in truth
    ]
    manifest = write_manifest(str(tmp_path / "g.csv"), rows, ["path", "label", "key", "g"])
    out = str(tmp_path / "g")
    info = run_convert(manifest, out, "--dedupe=near", "--group_by=g", "--splits=a=0.4,b=0.3,c=0.3")
    where = split_of_keys(out)
    joined = {k for k, s in truth.items() if s == 0} | {"dog/src10.jpg", "fox/src11.jpg"}
    assert len({where[k] for k in joined}) == 1
    assert where["cat/src09.jpg"] == where["cat/src12.jpg"]
    plain = str(tmp_path / "plain")
    run_convert(manifest, plain, "--group_by=g", "--splits=a=0.4,b=0.3,c=0.3")
    assert split_of_keys(plain)["cat/src09.jpg"] == where["cat/src09.jpg"]  # g9 unmoved
    # the counts are the near-duplicates', not the groups they join
    assert info["near_duplicates"]["clusters"] == WITH_VARIANTS
    assert info["near_duplicates"]["inputs_in_clusters"] == WITH_VARIANTS * (1 + len(VARIANTS))


def test_fingerprint_files_are_checked_and_the_audit_decodes_without_them(grouped, tmp_path):
    import shutil

    from audit.validate import validate

    info, out = grouped
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    shard = info["splits"]["a"]["shards"][0]
    path = os.path.join(copy, shard["near"])
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    with open(path, "wb") as f:
        f.writelines(lines[:3])
    assert any("not the" in p and shard["near"] in p for p in validate(copy))
    assert leaks.Side(copy).stored is False  # a short file: that shard decoded instead
    os.remove(path)
    assert any("missing" in p for p in validate(copy))
    side = leaks.Side(copy)
    assert side.stored is False
    assert sorted(side.keys) == sorted(leaks.Side(out).keys)


def test_path_records_and_gzip_shards(corpus, tmp_path, capsys):
    root, _ = corpus
    out = str(tmp_path / "path")
    run_convert(root, out, "--record_kind=path", "--compression=gzip", "--splits=a=0.5,b=0.5")
    assert cli.main(["leaks", out, "--json", "--top=0"]) == 1  # decoded from the paths
    report = json.loads(capsys.readouterr().out)
    assert report["leaked_images"] > 0 and report["closest"] == []
    assert cli.main(["leaks", str(tmp_path / "nothing")]) == 2  # an error is not a leak


def test_the_summary_warns_of_a_cluster_that_swallows_the_split(grouped):
    info, out = grouped
    found = dict(info["near_duplicates"], largest_cluster=info["inputs"] // 2)
    said = convert_command.summary(DatasetInfo.of({**info, "near_duplicates": found}), out, 1.0)
    assert f"one cluster holds {info['inputs'] // 2} of {info['inputs']} inputs" in said
    assert "! one cluster" not in convert_command.summary(DatasetInfo.of(info), out, 1.0)


@pytest.fixture(scope="module")
def icons(tmp_path_factory):
    """16-px palette PNGs whose transparency is a byte string (Pillow warns converting
    them), each saved under three names (one of them holding a newline), converted
    into two splits without --dedupe near: the copies leak."""
    root = tmp_path_factory.mktemp("icons") / "images"
    rng = np.random.default_rng(3)
    for i in range(8):
        im = Image.fromarray(rng.integers(0, 16, (16, 16), dtype=np.uint8), "P")
        im.putpalette([int(v) for v in rng.integers(0, 256, 48)])
        for label, name in (("a", f"i{i}.png"), ("b", f"i{i}.png"), ("b", f"line\nbreak{i}.png")):
            (root / label).mkdir(parents=True, exist_ok=True)
            im.save(root / label / name, transparency=bytes([0, 128] + [255] * 14))
    out = str(tmp_path_factory.mktemp("icons_out") / "out")
    run_convert(str(root), out, "--splits=x=0.5,y=0.5")
    return out


def test_leaks_on_palette_icons_prints_no_warnings_and_escapes_keys(icons):
    """Pillow's palette-transparency UserWarning was printed for every image (708 lines);
    a key holding a newline split a line of the text report."""
    done = subprocess.run(
        [sys.executable, "-m", "evenshard", "leaks", icons, "--top=100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    # stderr holds only the gate's one line (no Pillow warnings): why the exit is 1
    assert done.stderr.startswith("evenshard leaks: exit 1: ") and done.stderr.count("\n") == 1
    assert "more than --max_leaked 0" in done.stderr, done.stderr
    pairs = [line for line in done.stdout.splitlines() if " bits  " in line]
    assert pairs and all(line.startswith("     0 bits  ") for line in pairs), done.stdout
    assert any("line\\nbreak" in line for line in pairs)  # escaped as --json escapes it


def test_the_contact_sheet_shows_small_images_large_and_is_not_written_empty(
    icons, tmp_path, capsys
):
    sheet = tmp_path / "sheet.png"
    assert cli.main(["leaks", icons, f"--sheet={sheet}"]) == 1
    with Image.open(sheet) as im:
        cell = im.convert("L").crop((10, 10, 138, 138))  # the first pair's first image
        left, top, right, bottom = Image.eval(cell, lambda v: 255 - v).getbbox()
        assert im.size[1] == 10 + sheet_module.SHEET_ROWS * 138  # the closest 12 pairs
    assert right - left > 100 and bottom - top > 100  # 16 px drawn at 128, not at 16
    said = capsys.readouterr().out
    assert f"contact sheet: {sheet} (the closest 12 of the 14 pairs listed)" in said
    # no pair listed: nothing written, and an earlier run's sheet is not left to mislead
    empty = tmp_path / "empty.png"
    empty.write_bytes(sheet.read_bytes())
    assert cli.main(["leaks", icons, "--top=0", f"--sheet={empty}"]) == 1
    assert not empty.exists()
    assert "--top 0 lists no pairs: no contact sheet written" in capsys.readouterr().out


def test_a_sixteen_bit_image_is_drawn_on_the_sheet_as_it_is_hashed():
    """A 16-bit image was drawn white (Pillow's RGBA conversion saturates it); it is
    scaled to 8 bits first, as the fingerprint does."""
    ramp = np.tile(np.arange(1, 65, dtype=np.uint16) * 1000, (64, 1))  # all above 255
    drawn = np.asarray(sheet_module._thumbnail(Image.fromarray(ramp), 128).convert("L"))
    assert drawn.min() < 20 and drawn.max() > 230  # the ramp, dark to light


@pytest.mark.parametrize("where", ["sheet.json", "folder", "/dev/full", "missing/sheet.png"])
def test_a_sheet_path_that_is_no_png_is_a_usage_error_in_one_line(icons, where, tmp_path, capsys):
    """Pillow's traceback and exit 1 before, the code of "leaks found"."""
    (tmp_path / "folder").mkdir()
    path = where if where.startswith("/") else str(tmp_path / where)
    assert cli.main(["leaks", icons, f"--sheet={path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evenshard leaks: error: --sheet") and path in err[0]


def test_leaks_names_the_images_that_do_not_decode_and_audits_the_rest(tmp_path, capsys):
    """A dataset converted with --verify header can hold an image that does not decode:
    the audit stopped at it (exit 2); it leaves it out, names it, and audits the rest."""
    root = tmp_path / "images"
    rng = np.random.default_rng(5)
    photo = Image.open(io.BytesIO(photo_bytes(rng, 96, 128)))
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        photo.save(root / label / "same.png")  # one picture under both labels: a leak
        photo.rotate(90, expand=True).save(root / label / "other.png")
    whole = _encoded(photo.resize((64, 48)))
    (root / "a" / "cut.jpg").write_bytes(whole[: len(whole) // 2])  # its header is whole
    out = str(tmp_path / "out")
    run_convert(str(root), out, "--verify=header", "--splits=x=0.5,y=0.5", validated=False)
    assert cli.main(["leaks", out, "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert [u["key"] for u in report["undecoded"]] == ["a/cut.jpg"]
    assert "truncated" in report["undecoded"][0]["reason"]
    assert sum(report["images"].values()) == 4  # the rest audited
    cli.main(["leaks", out])
    assert "not audited, the image does not decode: 1 (first: " in capsys.readouterr().out
