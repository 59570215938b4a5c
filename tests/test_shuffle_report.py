"""evenshard shuffle-report on a small converted dataset."""

from __future__ import annotations

import json

from dataset_writer import write_dataset

from evenshard import cli


def test_report_writes_a_png_and_the_three_metrics(folder_500, tmp_path, capsys):
    data_dir = str(tmp_path / "ds")
    write_dataset(folder_500[0], data_dir, "--num_shards=4")
    png = str(tmp_path / "report.png")
    argv = [data_dir, "--out", png, "--batch_size=32", "--baseline", "--baseline_buffer=50"]
    assert cli.main(["shuffle-report", *argv]) == 0
    table = capsys.readouterr().out
    assert "label mix" in table and "order mem" in table and "repeats" in table
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["shuffle-report", *argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    ours = results["evenshard reader"]
    baseline = results["tf.data shuffle(50) of one sorted file"]
    # the input is label-sorted: a small buffer over a sorted file mixes badly
    assert baseline["label_mix_ratio"] > 2 > ours["label_mix_ratio"]
    assert baseline["order_memory"] > 0.5 > abs(ours["order_memory"])
    assert set(ours) == {
        "label_mix_ratio",
        "order_memory",
        "neighbour_repeats",
        "neighbour_repeats_vs_independent",
    }


def test_missing_dataset_is_an_error(tmp_path, capsys):
    assert cli.main(["shuffle-report", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 1
    assert "dataset_info.json not found" in capsys.readouterr().err


def test_baseline_buffer_defaults_to_a_tenth_of_the_split_and_the_table_explains(
    folder_500, tmp_path, capsys
):
    data_dir = str(tmp_path / "ds")
    info = write_dataset(folder_500[0], data_dir, "--num_shards=4")
    png = str(tmp_path / "report.png")
    argv = ["shuffle-report", data_dir, "--out", png, "--batch_size=32", "--baseline"]
    assert cli.main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["baseline_buffer"] == info["splits"]["train"]["num_examples"] // 10
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "1 = random" in table and "Spearman" in table and "independent shuffle" in table


def test_the_report_reads_by_place_or_in_runs_as_asked(tmp_path, capsys):
    """A local read is one permutation an epoch; --no_random_access reads the runs and
    windows a bucket is read in (--shuffle_buffer and the like shape only that order),
    and the report says which it read."""
    import json

    from dataset_writer import write_dataset

    from evenshard import cli, synthetic

    root = tmp_path / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=20, formats=("png",))
    out = str(tmp_path / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    reports = []
    for extra in ([], ["--no_random_access"]):
        png = str(tmp_path / f"r{len(extra)}.png")
        argv = ["shuffle-report", out, "--out", png, "--batch_size", "8", "--json", *extra]
        assert cli.main(argv) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert (
        "random_access" not in reports[0]["reader_options"]
        or reports[0]["reader_options"]["random_access"] is None
    )
    assert reports[1]["reader_options"]["random_access"] is False
    assert reports[0]["order"].startswith("one permutation of the records an epoch")
    assert reports[1]["order"].startswith("runs of shards interleaved, then a shuffle window")
    # explain says the same read, row for row, as the reader gives in each mode
    import reader

    for extra, access in (([], None), (["--no_random_access"], False)):
        argv = ["explain", out, "--steps", "0:2", "--seed", "0", "--batch_size", "8", *extra]
        assert cli.main(argv) == 0
        said = [line.split()[-1] for line in capsys.readouterr().out.splitlines()[1:]]
        ds = reader.make_dataset(out, "train", 8, seed=0, decode=False, random_access=access)
        keys = [k.decode() for b in ds.take(2) for k in b["key"].numpy()]
        assert said == keys, extra
