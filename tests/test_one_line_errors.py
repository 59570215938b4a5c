"""Every user mistake is one clear line, at once: never a traceback, never a late failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import read_rejects, run_convert, write_pngs
from dataset_writer import write_dataset

import reader
from convert_core.options import UserError
from evenshard import cli, convert_command

PY = sys.executable


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("one_line") / "img")
    write_pngs(root, 6)
    return root


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seeed=3"], "unknown flag(s): --seeed (did you mean --seed?)"),
        (["--output-dir=x"], "--output-dir (did you mean --output_dir?)"),
        (["--direct_running_mode=bogus"], "argument --direct_running_mode: invalid choice"),
        (["--num_shards=100000"], "--num_shards must be in [1, 99999]"),
        (["--s3_endpoint_url=http://127.0.0.1:9"], "--s3_endpoint_url: convert reaches s3://"),
        ([f"--splits={'s' * 250}=1.0"], "at most 128 of them"),
        (["--examples_per_shard=0"], "--examples_per_shard must be a whole number >= 1"),
        (["--examples_per_shard=2.5"], "--examples_per_shard: invalid int value: '2.5'"),
        (
            ["--examples_per_shard=100", "--num_shards=4"],
            "--examples_per_shard and --num_shards both set the shard count: give one",
        ),
        (
            ["--examples_per_shard=100", "--target_shard_mb=10"],
            "--examples_per_shard and --target_shard_mb both set the shard count: give one",
        ),
    ],
)
@pytest.mark.fast
def test_flag_mistakes_are_one_line(images, tmp_path, capsys, caplog, flags, message):
    argv = ["convert", f"--input={images}", f"--output_dir={tmp_path / 'out'}", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not [r for r in caplog.records if "Discarding unparseable" in r.getMessage()]
    assert not (tmp_path / "out" / ".incomplete").exists()


@pytest.mark.parametrize(
    "given, message",
    [
        ("img/l0/0.png", "is a file, not a folder"),
        ("http://example.com/images", "local paths, gs:// and s3:// URLs, not http://"),
        ("nowhere", "folder 'nowhere' does not exist"),
    ],
)
def test_input_mistakes_say_what_the_input_is(images, tmp_path, given, message):
    if given.startswith("img/"):
        given = os.path.join(os.path.dirname(images), given)
    with pytest.raises(UserError, match=message):
        run_convert(given, str(tmp_path / "out"))


def record_folders(root) -> dict[str, str]:
    """A folder of each record format, written by its own library: format -> folder."""
    from test_parquet_input import write_parquet
    from test_tfrecord_input import example, pngs, write_records
    from test_webdataset_input import samples, write_tars

    write_records(f"{root}/rec/r0.tfrecord", [example(pngs(1)[0], 0)])
    write_parquet(f"{root}/hf/train-0.parquet", pngs(2), [0, 1])
    write_tars(f"{root}/wds/t-%03d.tar", samples(2, cls=lambda i: i), 2)
    return {"tfrecord": f"{root}/rec", "parquet": f"{root}/hf", "webdataset": f"{root}/wds"}


def test_a_folder_of_record_files_says_which_input_format(images, tmp_path):
    """A folder of TFRecord, Parquet or WebDataset files given as an image folder: one
    line naming a file and the --input_format to add (was: TFRecord only; Parquet files
    and tars were each an unsupported_format reject); the emulator's convert line for
    such a folder carries the flag."""
    from convert_core.record_rules import record_input_formats
    from evenshard.emulator import convert_line

    expected = {
        "tfrecord": "TFRecord files (r0.tfrecord)",
        "parquet": "Parquet files (train-0.parquet)",
        "webdataset": "WebDataset files (t-000.tar)",
    }
    for fmt, folder in record_folders(tmp_path).items():
        line = f"--input: folder {folder!r} holds {expected[fmt]}, no images: add "
        with pytest.raises(UserError, match=re.escape(f"{line}--input_format={fmt}")):
            run_convert(folder, str(tmp_path / "out"))
        said = convert_line("gs://local/x", folder)
        assert said.endswith(f" --input_format {fmt}"), said
    assert "--input_format" not in convert_line("gs://local/x", images)
    version = ["dataset_info.json", "features.json", "mnist-train.tfrecord-00000-of-00001"]
    assert record_input_formats(version) == {"tfds": version[2:]}  # a TFDS version folder


def test_manifest_oddities_are_row_rejects(images, tmp_path):
    """A 200 KB field, bytes that are not UTF-8 after the first 4 KB, unnamed columns."""
    rows = [f"{os.path.join(images, f'l{i % 2}', f'{i}.png')},l{i % 2},," for i in range(6)]
    filler = [f"{'x' * 100}/{j}.png,l0,," for j in range(60)]  # 6 KB of missing files
    text = "path,label,,\n" + "\n".join(rows + filler) + "\n"
    data = text.encode() + b"caf\xe9.png,l0,,\n" + ("y" * 200_000 + ".png,l1,,\n").encode()
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(data)
    info = run_convert(str(manifest), str(tmp_path / "out"), "--max_reject_fraction=1")
    assert info["inputs"] == 68
    rejects = {r["key"][:8]: r for r in read_rejects(str(tmp_path / "out"))}
    assert rejects["row:68"]["reason"] == "bad_path"  # caf\xe9.png
    assert "not valid UTF-8" in rejects["row:68"]["detail"]
    assert rejects["y" * 8]["reason"] == "unreadable"  # a name too long to open


def test_a_label_with_any_line_break_is_rejected(tmp_path):
    write_pngs(tmp_path / "img", 6)
    for i, brk in enumerate(("\u2028", "\x85", "\x1c", "\v")):
        os.makedirs(tmp_path / "img" / f"a{brk}b")
        os.rename(
            tmp_path / "img" / f"l{i % 2}" / f"{i}.png", tmp_path / "img" / f"a{brk}b" / "x.png"
        )
    info = run_convert(str(tmp_path / "img"), str(tmp_path / "out"), "--max_reject_fraction=1")
    assert info["rejects"]["by_reason"] == {"bad_label": 4}
    labels = (tmp_path / "out" / "labels.txt").read_text()
    assert labels.splitlines() == info["labels"] == [] or labels.splitlines() == info["labels"]


def test_the_reject_limit_is_one_line_from_worker_processes(tmp_path):
    """In multi-process mode the refusal came from a worker, wrapped: 186 lines of
    tracebacks. It is raised in the driver after the run: one line on stderr."""
    write_pngs(tmp_path / "img", 4)
    for i in range(2):
        (tmp_path / "img" / "l0" / f"text_{i}.png").write_text("not an image")
    argv = [os.path.join(os.path.dirname(PY), "evenshard"), "convert"]
    argv += [f"--input={tmp_path / 'img'}", f"--output_dir={tmp_path / 'out'}"]
    argv += ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    env = {**os.environ, "EVENSHARD_PROGRESS_SECONDS": "3600"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and not done.stdout
    assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert "2 of 6 inputs were rejected, above --max_reject_fraction" in done.stderr
    assert not (tmp_path / "out" / "dataset_info.json").exists()


@pytest.mark.fast
def test_read_options_and_states_refuse_what_is_not_a_count(images):
    for kw in ({"epochs": 2.0}, {"seed": True}, {"start_step": 1.5}):
        with pytest.raises(TypeError, match="must be a whole number"):
            reader.ReadOptions(**kw)
    with pytest.raises(ValueError, match="num_workers must be a whole number >= 1"):
        reader.ReadState(seed=0, batch_size=2, num_workers=0)


def test_python_m_reader_has_help_and_says_what_is_wrong(tmp_path):
    done = subprocess.run([PY, "-m", "reader", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--path_root" in done.stdout and not done.stderr
    write_pngs(tmp_path / "img", 6)
    out = str(tmp_path / "out")
    write_dataset(str(tmp_path / "img"), out, "--splits=train=0.95,empty=0.05")  # empty: 0
    # a split that is not there, or empty: one line, before TensorFlow is imported
    for split, line in (
        ("val", f"split 'val' not in {out}; it has empty, train"),
        ("empty", f"split 'empty' of {out} has no examples; it has empty (0), train (6)"),
    ):
        done = subprocess.run(
            [PY, "-c", NOT_THERE, out, f"--split={split}"], capture_output=True, text=True
        )
        assert done.stdout == "2 tensorflow not imported\n", (done.stdout, done.stderr)
        assert done.stderr == f"python -m reader: error: {line}\n", done.stderr


# python -m reader (its argv after -c's), then its exit code and whether it imported TensorFlow
NOT_THERE = """
import runpy, sys
try:
    runpy.run_module("reader", run_name="__main__")
except SystemExit as e:
    print(e.code, "tensorflow", "imported" if "tensorflow" in sys.modules else "not imported")
"""


def test_shuffle_report_into_a_missing_folder_is_one_line(images, tmp_path, capsys):
    write_dataset(images, str(tmp_path / "out"), "--splits=train=1.0")
    argv = ["shuffle-report", str(tmp_path / "out"), "--batch_size=2"]
    assert cli.main([*argv, f"--out={tmp_path / 'no' / 'r.png'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist; create it first" in err[0]


@pytest.mark.fast
def test_a_file_system_failure_while_writing_is_one_line():
    wrapped = (
        "RuntimeError: OSError: [Errno 28] No space left on device: "
        "'/data/out/.incomplete/train-00003-of-00016.tfrecord.ab12' [while running 'Write']"
    )
    line = convert_command.io_failure(wrapped, "/data/out/")
    assert line.startswith("writing /data/out/.incomplete/train-00003-of-00016.tfrecord.ab12")
    assert "No space left on device" in line and "run the same command again" in line
    gone = "FileNotFoundError: [Errno 2] No such file or directory: '/data/out/.incomplete/x'"
    assert "No such file or directory" in convert_command.io_failure(gone, "/data/out")
    # a relative --output_dir: the runner names the folder as the Job resolved it
    here = f"FileNotFoundError: [Errno 2] No such file or directory: '{os.path.abspath('out')}/x'"
    assert "No such file or directory" in convert_command.io_failure(here, "out")
    # a vanished input, or any other error, is not this
    assert (
        convert_command.io_failure("[Errno 2] No such file or directory: '/in/x.png'", "/data/out")
        is None
    )
    assert convert_command.io_failure("ValueError: something else", "/data/out") is None


_INTERRUPTED = """
import sys
from evenshard import cli

def interrupted(*_):
    raise KeyboardInterrupt

cli._RUN["inspect"] = interrupted
sys.argv = ["evenshard", "inspect", "somewhere"]
cli.run()
"""


def test_ctrl_c_in_any_subcommand_is_one_line_and_exit_code_130():
    """The command ends an interrupt in one line with exit code 130; called as a
    function (``cli.main``) the interrupt is the caller's."""
    done = subprocess.run([PY, "-c", _INTERRUPTED], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "evenshard inspect: interrupted\n")
    with pytest.MonkeyPatch.context() as m:
        m.setitem(cli._RUN, "inspect", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            cli.main(["inspect", "somewhere"])


def test_a_reader_that_leaves_the_pipe_early_is_no_traceback(tmp_path):
    """`evenshard inspect --json | head`: the command wrote into a pipe whose reader had
    gone and printed BrokenPipeError's traceback."""
    write_pngs(tmp_path / "img", 6)
    out = str(tmp_path / "out")
    write_dataset(str(tmp_path / "img"), out, "--splits=train=1.0")
    done = subprocess.Popen(
        [PY, "-m", "evenshard", "inspect", out, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    done.stdout.close()  # gone before the command writes a byte
    err = done.stderr.read()
    assert done.wait(timeout=120) == 0 and err == "", err


def test_a_workers_error_is_one_line_only_when_it_is_evenshards_and_last():
    """The multi-processing runner hands back a worker's traceback as text: evenshard's
    own error (convert_core's too) becomes one line; a fault raised while handling it
    is shown whole (it was reported as the user's mistake)."""
    import traceback

    from schemas.errors import InvalidValueError

    def text(fn) -> str:
        try:
            fn()
        except Exception:
            return "RuntimeError: " + traceback.format_exc()

    def ours():
        raise InvalidValueError("--near_embedding m:f gave no array [while running 'A/B']")

    def fault():
        try:
            ours()
        except InvalidValueError:
            return {}["missing"]

    def refused():
        raise UserError("--input: no such folder")

    assert convert_command.raised_in_a_worker(text(ours)) == "--near_embedding m:f gave no array"
    assert convert_command.raised_in_a_worker(text(fault)) is None
    assert convert_command.raised_in_a_worker(text(refused)) == "--input: no such folder"


def test_make_images_into_a_folder_with_files_is_refused(tmp_path, capsys):
    """Images added beside others would make a sample set nobody asked for."""
    root = tmp_path / "photos"
    assert cli.main(["make-images", str(root), "--num_labels=1", "--per_label=2"]) == 0
    capsys.readouterr()
    assert cli.main(["make-images", str(root), "--num_labels=1", "--per_label=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root} is not empty" in err and "new folder" in err
    assert len(list(root.rglob("*.*"))) == 2


def test_make_images_into_a_file_s_path_is_refused(tmp_path, capsys):
    """A path that is, or lies under, a file: one line, not a traceback."""
    (tmp_path / "notes.txt").write_text("x")
    for root in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "photos"):
        assert cli.main(["make-images", str(root), "--num_labels=1", "--per_label=2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tmp_path / 'notes.txt'} is a file" in err
