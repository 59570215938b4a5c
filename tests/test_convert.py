"""End-to-end: convert real generated folders and manifests on the DirectRunner."""

from __future__ import annotations

import collections
import math
import os
import shutil

import pytest
from conftest import (
    keys_of,
    load_info,
    read_rejects,
    read_split,
    run_convert,
    write_manifest,
    write_pngs,
)

from convert_core.split import cut_points
from evenshard import synthetic

SEEDED = ("--seed=7", "--num_shards=4")


@pytest.fixture(scope="module")
def converted(folder_500, tmp_path_factory):
    root, broken = folder_500
    out = str(tmp_path_factory.mktemp("converted"))
    return run_convert(root, out, *SEEDED), out, broken


def shas(info: dict) -> list[str]:
    splits = info["splits"]
    return [s["sha256"] for split in sorted(splits) for s in splits[split]["shards"]]


def test_counts_reconcile_and_rejects_are_listed(converted):
    info, out, broken = converted
    written = sum(s["num_examples"] for s in info["splits"].values())
    assert info["inputs"] == 506
    assert written == 500
    assert info["inputs"] == written + info["rejects"]["total"]
    rejects = {r["key"]: r["reason"] for r in read_rejects(out)}
    assert rejects == broken
    assert info["rejects"]["by_reason"] == dict(collections.Counter(broken.values()))
    from apache_beam.transforms import userstate

    assert hasattr(userstate.get_dofn_specs, "remembers")  # convert inspects a DoFn once


def test_shards_are_balanced_and_splits_disjoint(converted):
    info, out, _ = converted
    seen: dict[str, str] = {}
    for split, s in info["splits"].items():
        sizes = [sh["num_examples"] for sh in s["shards"]]
        assert len(sizes) == 4
        assert max(sizes) - min(sizes) <= 1, (split, sizes)
        shards = read_split(out, split)
        assert [len(records) for records in shards] == sizes
        for records in shards:
            for key in keys_of(records):
                assert key not in seen, f"{key} in {split} and {seen[key]}"
                seen[key] = split
    assert len(seen) == 500
    assert sorted(os.listdir(out)) == sorted(
        [".evenshard", "dataset_info.json", "labels.txt", "schema.pbtxt", "rejects"]
        + [sh["file"] for s in info["splits"].values() for sh in s["shards"]]
        + [sh["file"] + ".idx" for s in info["splits"].values() for sh in s["shards"]]
    )


def test_records_carry_label_ids_and_image_metadata(converted, folder_500):
    info, out, _ = converted
    root, _ = folder_500
    from PIL import Image

    for r in read_split(out, "val")[0][:20]:
        key = r["image/key"].decode()
        label = key.split("/")[0]
        assert info["labels"][r["image/class/label"]] == label
        assert r["image/class/text"].decode() == label
        with open(os.path.join(root, key), "rb") as f:
            assert r["image/encoded"] == f.read()
        with Image.open(os.path.join(root, key)) as im:
            assert (r["image/width"], r["image/height"]) == im.size
            assert (
                r["image/format"].decode()
                == {"JPEG": "jpeg", "PNG": "png", "GIF": "gif", "WEBP": "webp"}[im.format]
            )


def test_same_inputs_and_seed_give_identical_bytes(converted, folder_500, tmp_path):
    info, _, _ = converted
    again = run_convert(folder_500[0], str(tmp_path / "again"), *SEEDED)
    assert shas(again) == shas(info)
    other_seed = run_convert(folder_500[0], str(tmp_path / "seed8"), "--seed=8", "--num_shards=4")
    assert shas(other_seed) != shas(info)


@pytest.mark.slow
def test_multiprocessing_runner_gives_identical_bytes(converted, folder_500, tmp_path):
    info, _, _ = converted
    multi = run_convert(
        folder_500[0],
        str(tmp_path / "multi"),
        *SEEDED,
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    )
    assert shas(multi) == shas(info)


def test_order_is_pinned_for_a_fixed_seed(converted):
    # Pins the permutation itself (split hash + order fingerprints over fixed
    # key names), independent of image encoder versions.
    _, out, _ = converted
    assert keys_of(read_split(out, "train")[0])[:5] == PINNED_TRAIN_HEAD


PINNED_TRAIN_HEAD = [
    "label_2/img_00088.gif",
    "label_0/img_00047.webp",
    "label_4/img_00015.webp",
    "label_3/img_00025.jpg",
    "label_3/img_00009.jpg",
]


def test_label_sorted_input_is_mixed_in_every_shard(converted):
    from scipy.stats import chi2_contingency

    info, out, _ = converted  # folder listing is sorted by label: a label-sorted input
    train = info["splits"]["train"]
    table = [
        [sh["label_counts"].get(label, 0) for label in info["labels"]] for sh in train["shards"]
    ]
    # Shards are random subsets: a label-by-shard table shows no dependence.
    assert chi2_contingency(table).pvalue > 0.001
    for records in read_split(out, "train"):
        labels = [r["image/class/label"] for r in records]
        runs = sum(1 for a, b in zip(labels, labels[1:]) if a != b)
        assert runs > len(labels) * 0.6  # a label-sorted file has 4 label changes


def test_balance_label_gives_every_shard_the_label_mix(folder_500, tmp_path):
    info = run_convert(
        folder_500[0], str(tmp_path / "bal"), "--balance=label", "--num_shards=6", "--seed=3"
    )
    for split, s in info["splits"].items():
        sizes = [sh["num_examples"] for sh in s["shards"]]
        assert max(sizes) - min(sizes) <= 1
        for label, n in s["label_counts"].items():
            for sh in s["shards"]:
                expected = n / len(s["shards"])
                assert abs(sh["label_counts"].get(label, 0) - expected) < 1, (split, label)
    # every window of 25 consecutive records holds every label (5 labels)
    for records in read_split(str(tmp_path / "bal"), "train"):
        labels = [r["image/class/label"] for r in records]
        for i in range(len(labels) - 25):
            assert len(set(labels[i : i + 25])) == 5


def test_hash_split_is_stable_when_the_dataset_grows(folder_500, tmp_path):
    root = str(tmp_path / "images")
    shutil.copytree(folder_500[0], root)
    before = run_convert(root, str(tmp_path / "before"), "--max_reject_fraction=0.05")
    synthetic.make_image_folder(root + "_new", num_labels=5, per_label=10, seed=9)
    for label in os.listdir(root + "_new"):
        for name in os.listdir(os.path.join(root + "_new", label)):
            shutil.copy(
                os.path.join(root + "_new", label, name), os.path.join(root, label, "new_" + name)
            )
    after = run_convert(root, str(tmp_path / "after"), "--max_reject_fraction=0.05")
    split_of = {}
    for split in before["splits"]:
        for records in read_split(str(tmp_path / "before"), split):
            split_of.update({k: split for k in keys_of(records)})
    moved = 0
    for split in after["splits"]:
        for records in read_split(str(tmp_path / "after"), split):
            moved += sum(1 for k in keys_of(records) if split_of.get(k, split) != split)
    assert moved == 0
    assert sum(s["num_examples"] for s in after["splits"].values()) == 550


def _manifest_rows(root: str) -> list[dict]:
    rows = []
    for label in sorted(os.listdir(root)):
        if not os.path.isdir(os.path.join(root, label)):
            continue
        for name in sorted(os.listdir(os.path.join(root, label))):
            if name.startswith("img_"):
                rows.append(
                    {
                        "path": f"{label}/{name}",
                        "label": label,
                        "subject": f"{label}-s{int(name[4:9]) // 7}",
                    }
                )
    return rows


def test_group_by_keeps_each_group_in_one_split(folder_500, tmp_path):
    root = folder_500[0]
    manifest = write_manifest(
        os.path.join(os.path.dirname(root), "groups.csv"),
        [dict(r, path="images/" + r["path"]) for r in _manifest_rows(root)],
        ["path", "label", "subject"],
    )
    out = str(tmp_path / "grouped")
    run_convert(manifest, out, "--group_by=subject")
    group_split: dict[str, set] = collections.defaultdict(set)
    for split in ("train", "val", "test"):
        for records in read_split(out, split):
            for key in keys_of(records):
                label, name = key.split("/")[1:]
                group_split[f"{label}-s{int(name[4:9]) // 7}"].add(split)
    assert len(group_split) > 50
    assert all(len(splits) == 1 for splits in group_split.values())


def test_exact_split_gives_exact_per_label_counts(folder_500, tmp_path):
    info = run_convert(
        folder_500[0],
        str(tmp_path / "exact"),
        "--split_mode=exact",
        "--splits=train=0.7,val=0.2,test=0.1",
    )
    for label in info["labels"]:
        cuts = cut_points([0.7, 0.2, 0.1], 100)  # the broken files are rejected
        expected = dict(
            zip(["train", "val", "test"], [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1]])
        )
        got = {s: info["splits"][s]["label_counts"].get(label, 0) for s in expected}
        assert got == expected == {"train": 70, "val": 20, "test": 10}


def test_examples_per_shard_sets_each_splits_shard_count(tmp_path):
    """About N examples a file without knowing their size: ceil(examples / N) shards a
    split, rounded up to --shard_multiple, balanced within one example."""
    write_pngs(tmp_path / "img", 41)
    flags = ("--splits=train=0.7,val=0.3", "--examples_per_shard=4", "--shard_multiple=2")
    info = run_convert(str(tmp_path / "img"), str(tmp_path / "out"), *flags)
    for split, s in info["splits"].items():
        n, sizes = s["num_examples"], [sh["num_examples"] for sh in s["shards"]]
        assert len(sizes) == math.ceil(math.ceil(n / 4) / 2) * 2, (split, n, sizes)
        assert max(sizes) - min(sizes) <= 1, (split, sizes)
    assert info["shard_options"]["examples_per_shard"] == 4


def test_manifest_split_column_is_honoured(folder_500, tmp_path):
    root = folder_500[0]
    rows = [
        dict(r, path="images/" + r["path"], split="holdout" if i % 10 == 0 else "")
        for i, r in enumerate(_manifest_rows(root))
    ]
    manifest = write_manifest(str(tmp_path / "m.csv"), rows, ["path", "label", "split"])
    shutil.copytree(root, str(tmp_path / "images"))
    out = str(tmp_path / "given")
    info = run_convert(manifest, out)
    assert info["splits"]["holdout"]["num_examples"] == 50
    holdout = {k for records in read_split(out, "holdout") for k in keys_of(records)}
    assert holdout == {
        "images/" + r["path"] for i, r in enumerate(_manifest_rows(root)) if i % 10 == 0
    }


def test_path_kind_records_resolve_to_the_sources(folder_500, tmp_path):
    root = folder_500[0]
    out = str(tmp_path / "paths")
    info = run_convert(root, out, "--record_kind=path", "--compression=gzip")
    assert info["path_root"] == os.path.abspath(root)
    assert all(
        sh["file"].endswith(".tfrecord.gz") for s in info["splits"].values() for sh in s["shards"]
    )
    n = 0
    for split in info["splits"]:
        for records in read_split(out, split):
            for r in records:
                assert "image/encoded" not in r
                path = os.path.join(info["path_root"], r["image/path"].decode())
                assert os.path.isfile(path)
                assert r["image/path"] == r["image/key"]
                n += 1
    assert n == 500


def test_schema_and_labels_describe_the_dataset(converted):
    import schemas

    info, out, _ = converted
    with open(os.path.join(out, "labels.txt")) as f:
        assert f.read().splitlines() == info["labels"]
    schema = schemas.load(out)
    features = {f.name: f for f in schema.feature}
    assert features["image/class/label"].int_domain.max == len(info["labels"]) - 1
    assert sorted(features["image/format"].string_domain.value) == info["formats"]
    assert "image/encoded" in features and "image/path" not in features


@pytest.mark.slow
def test_the_default_mode_shows_progress_names_the_runner_and_gives_the_same_bytes(
    converted, folder_500, tmp_path
):
    """`evenshard convert` with no runner flags, as a user runs it; progress every element.
    500 inputs are below the size where every core pays off: one in-memory worker."""
    import subprocess
    import sys

    info, _, _ = converted
    out = tmp_path / "default"
    argv = [os.path.join(os.path.dirname(sys.executable), "evenshard"), "convert"]
    argv += [f"--input={folder_500[0]}", f"--output_dir={out}", *SEEDED]
    env = dict(os.environ, EVENSHARD_PROGRESS_SECONDS="0")
    done = subprocess.run(
        [*argv, "--max_reject_fraction=0.05"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runner: DirectRunner (in_memory, 1 worker)" in done.stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("evenshard: ")]
    stages = {line.split(":")[1].strip() for line in progress}
    assert {"list", "inspect", "write"} <= stages, done.stderr[-2000:]
    written = [line for line in progress if line.startswith("evenshard: write: ")]
    assert all(" records (" in line and "/s, worker " in line for line in written)
    assert shas(load_info(str(out))) == shas(info)


def test_the_local_default_is_every_core_for_large_inputs_only():
    from beam_jobs.runners import local_default

    cores = os.cpu_count()
    many = local_default(["--seed_flag_of_beam=1"], lambda: True)
    if cores > 1:
        assert many[-2:] == [
            "--direct_running_mode=multi_processing",
            f"--direct_num_workers={cores}",
        ]
    assert local_default([], lambda: False) == []

    def never() -> bool:
        raise AssertionError("inputs are not counted when a runner flag is given")

    given = ["--direct_num_workers=3"]
    assert local_default(given, never) == given
    assert local_default(["--runner=dask"], never) == ["--runner=dask"]


def test_inputs_are_counted_without_a_csv_header(tmp_path):
    from beam_jobs.input_size import has_at_least
    from convert_core.job import Job
    from convert_core.options import ConvertOptions

    rows = "".join(f"x{i}.png,a\n" for i in range(3))
    (tmp_path / "m.csv").write_text("path,label\n" + rows)
    (tmp_path / "m.jsonl").write_text(
        "".join(f'{{"path": "x{i}.png", "label": "a"}}\n' for i in range(3))
    )
    for name in ("m.csv", "m.jsonl"):
        job = Job.of(ConvertOptions(input=str(tmp_path / name), output_dir=str(tmp_path / "o")))
        assert has_at_least(job, 3) and not has_at_least(job, 4), name


def test_a_split_left_empty_is_said_with_what_to_do(tmp_path):
    """Six inputs cut 80/10/10 leave a split empty: the summary says which, why (10 % of
    6 is under one; with more inputs, where the keys' hashes fall, or the exact
    mode's rounding) and what gives it examples; a split that got some is not named."""
    from evenshard import convert_command
    from evenshard.synthetic import make_image_folder
    from schemas.dataset_info import DatasetInfo

    root = str(tmp_path / "images")
    make_image_folder(root, num_labels=2, per_label=3, formats=("png",), broken=False)
    out = str(tmp_path / "out")
    info = run_convert(root, out)
    empty = [s for s, v in info["splits"].items() if v["num_examples"] == 0]
    assert empty  # the seed's cut, fixed: a test of the summary, not of the hash
    said = convert_command.summary(DatasetInfo.of(info), out, 1.0)
    for name in empty:
        assert f"! {name} is empty: its 10 % of 6 inputs is under one; give more" in said
    assert "! train is empty" not in said
    full = {**info, "splits": {k: v for k, v in info["splits"].items() if k not in empty}}
    assert "is empty" not in convert_command.summary(DatasetInfo.of(full), out, 1.0)
    more = {**info, "inputs": 40}
    said = convert_command.summary(DatasetInfo.of(more), out, 1.0)
    assert "each of 40 inputs goes where its key's hash falls (--split_mode exact" in said
    options = {**info["split_options"], "split_mode": "exact"}
    exact = {**more, "split_options": options}
    said = convert_command.summary(DatasetInfo.of(exact), out, 1.0)
    assert "each label's share of its 10 % rounds to none" in said
