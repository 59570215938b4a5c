"""Crash and retry safety: retried writers, SIGKILL part-way, reruns into the same folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import run_convert

import reader
from audit import validate
from beam_jobs import write
from schemas import layout

FLAGS = ("--num_shards=4", "--seed=5", "--max_reject_fraction=0.05")


def shas(info):
    return [s["sha256"] for name in sorted(info["splits"]) for s in info["splits"][name]["shards"]]


@pytest.fixture(scope="module")
def clean_run(folder_500, tmp_path_factory):
    return run_convert(folder_500[0], str(tmp_path_factory.mktemp("clean")), *FLAGS)


class InjectedFailure(RuntimeError):
    pass


FAILURES = {"left": 0}


class _RetriedOnce(write._WriteShard):
    """Test only: models a runner retrying a bundle whose first attempt died mid-write."""

    def process(self, element, *side_inputs):
        try:
            return list(super().process(element, *side_inputs))
        except InjectedFailure:
            return list(super().process(element, *side_inputs))


def test_a_retried_shard_writer_gives_the_same_bytes_and_no_temp_files(
    folder_500, clean_run, tmp_path, monkeypatch
):
    real_read = write.read_again
    calls = {"n": 0}

    def flaky_read(*args):
        calls["n"] += 1
        if (
            calls["n"] == 30 and FAILURES["left"] > 0
        ):  # inside the first shard, after a partial write
            FAILURES["left"] -= 1
            raise InjectedFailure("disk went away")
        return real_read(*args)

    FAILURES["left"] = 1
    monkeypatch.setattr(write, "read_again", flaky_read)
    monkeypatch.setattr(write, "_WriteShard", _RetriedOnce)
    out = tmp_path / "retried"
    info = run_convert(folder_500[0], str(out), *FLAGS)
    assert FAILURES["left"] == 0  # the failure did happen
    assert shas(info) == shas(clean_run)
    assert not (out / layout.INCOMPLETE_DIR).exists()
    assert not [f for f in os.listdir(out) if ".tmp-" in f]


def test_sigkill_part_way_then_rerun(folder_500, clean_run, tmp_path):
    out = tmp_path / "killed"
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "evenshard"),
        "convert",
        f"--input={folder_500[0]}",
        f"--output_dir={out}",
        *FLAGS,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not (out / "rejects" / "rejects.jsonl").exists():  # part-way: shards come next
        assert proc.poll() is None and time.monotonic() < deadline, "convert ended early"
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "dataset_info.json").exists()

    with pytest.raises(reader.DatasetError, match="not a finished evenshard dataset"):
        reader.make_dataset(str(out), "train")
    assert validate.validate(str(out))[0].endswith(
        "a conversion left files here but did not finish: run it again)"
    )

    info = run_convert(folder_500[0], str(out), *FLAGS)  # no --overwrite needed: not finished
    assert shas(info) == shas(clean_run)
    listed = {
        name
        for s in info["splits"].values()
        for sh in s["shards"]
        for name in (sh["file"], sh["dali_index"])
    }
    assert set(os.listdir(out)) == listed | {
        ".evenshard",  # the marker: convert owns the files of its names here
        "dataset_info.json",
        "schema.pbtxt",
        "labels.txt",
        "rejects",
    }
