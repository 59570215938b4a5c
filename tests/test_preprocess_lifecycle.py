"""The Python route's processes (issue 41): a reader's worker processes, fork server and
resource tracker end with it however it ends (kill -9, Ctrl-C), its shared memory
blocks with them or at the next reader's start at the latest, and whatever a transform
does (exits, raises KeyboardInterrupt, cannot be rebuilt in a process) is one line
naming the function (and the key)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
from dataset_writer import write_dataset

import reader
from evenshard import synthetic
from reader.routes.preprocess import TransformError

B = 4
OPTS = dict(image_size=(12, 12), seed=4, epochs=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """16 images in 2 train shards."""
    root = tmp_path_factory.mktemp("life") / "images"
    synthetic.make_image_folder(str(root), num_labels=2, per_label=8, formats=("png",))
    out = str(tmp_path_factory.mktemp("life_out") / "ds")
    write_dataset(str(root), out, "--splits=train=1.0", "--num_shards=2")
    return out


# A training script: reads endlessly; from epoch 1 on, each transform says so on stderr
# and sleeps (a transform still running when the signal comes).
SCRIPT = textwrap.dedent(
    """
    import sys, time
    import reader

    def slow_later(example, rng):
        if example["epoch"] >= 1:
            print("transforming", file=sys.stderr, flush=True)
            time.sleep(30)
        return example

    if __name__ == "__main__":
        data, route = sys.argv[1], sys.argv[2]
        kw = dict(image_size=(12, 12), seed=0, epochs=None, transform=slow_later,
                  num_processes=int(sys.argv[3]) if sys.argv[3:] else 2)
        if route == "numpy":
            batches = reader.NumpyReader(data, "train", 4, **kw)
        else:
            batches = reader.make_dataset(data, "train", 4, **kw)
        try:
            for batch in batches:
                print("batch", flush=True)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            sys.exit(130)
    """
)


def _start(data, tmp_path, route: str, *more: str) -> tuple[subprocess.Popen, str]:
    """The script running in a session of its own, every process it starts marked by
    an environment variable (``_marked``)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    mark = uuid.uuid4().hex
    env = dict(os.environ, EVENSHARD_TEST_MARK=mark, PYTHONPATH=os.getcwd())
    run = subprocess.Popen(
        [sys.executable, str(script), data, route, *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    return run, mark


def _marked(mark: str) -> list[int]:
    """The processes (Linux) whose environment holds the mark."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"EVENSHARD_TEST_MARK={mark}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _gone(mark: str, within: float = 15) -> bool:  # a bound for a hang (they end in ~1 s)
    deadline = time.monotonic() + within
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _marked(mark)


def _blocks_of(pid: int) -> list[str]:
    """The shared memory blocks named after the reader of process ``pid``."""
    owner = re.compile(rf"evenshard-[0-9a-f]{{12}}-{pid}-")
    return [n for n in os.listdir("/dev/shm") if owner.match(n)]


def _mapped(mark: str) -> set[str]:
    """The entries of /dev/shm (shared memory blocks, multiprocessing's semaphores) the
    processes with the mark have mapped, whatever their names."""
    found = set()
    for pid in _marked(mark):
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:  # ended meanwhile
            continue
        for line in lines:  # address, perms, offset, device, inode, then the path
            path = (line.split(None, 5)[5:] or [""])[0].removesuffix(" (deleted)")
            if path.startswith("/dev/shm/"):
                found.add(path.removeprefix("/dev/shm/"))
    return found


def _left(names: set[str]) -> list[str]:
    """Those of ``names`` still in /dev/shm."""
    return sorted(n for n in names if os.path.exists(os.path.join("/dev/shm", n)))


def _wait_for(stream, line: str) -> list[str]:
    said = []
    for got in stream:
        said.append(got)
        if got == line + "\n":
            return said
    raise AssertionError(f"no {line!r} line: {''.join(said)}")


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, /dev/shm")


@pytest.mark.slow
def test_kill_9_of_the_training_process_leaves_no_process_and_no_block(data, tmp_path):
    """kill -9 of the training process alone (the OOM killer's way): its workers, fork
    server and resource tracker end (they waited forever), and its blocks with them, by
    the next reader's start at the latest (a worker caught making a block as the pipe
    closed can leave that one: seen once in three full runs)."""
    run, mark = _start(data, tmp_path, "numpy")
    try:
        for _ in range(3):
            _wait_for(run.stdout, "batch")
        assert len(_marked(mark)) >= 4  # the script, the fork server, 2 workers (a tracker)
        assert _blocks_of(run.pid)  # blocks named after the reader's process
        mapped = _mapped(mark)  # the blocks (the processes' pipes make no semaphore)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        assert _gone(mark), "a process of the killed reader is still running"
        if _blocks_of(run.pid):  # the rare block caught in the making: the next start's
            next(iter(reader.NumpyReader(data, "train", B, num_processes=0, **OPTS)))
        assert _blocks_of(run.pid) == []
        assert _left(mapped) == []
    finally:
        run.kill()
        run.wait()


@pytest.mark.slow
def test_kill_9_of_a_reader_decoding_in_its_own_process_leaves_no_block(data, tmp_path):
    """num_processes=0: the reader makes its blocks itself, and Python's resource
    tracker, which outlives it, unlinks them when it is killed (kill -9, or the OOM
    killer's; they were left when the tracker was kept out of every block)."""
    run, mark = _start(data, tmp_path, "numpy", "0")
    try:
        for _ in range(3):
            _wait_for(run.stdout, "batch")
        assert _blocks_of(run.pid)
        mapped = _mapped(mark)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        deadline = time.monotonic() + 15  # the tracker sees its pipe close, then unlinks
        while _left(mapped) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _blocks_of(run.pid) == [] and _left(mapped) == []
    finally:
        run.kill()
        run.wait()


@pytest.mark.slow
def test_kill_9_of_every_process_leaves_blocks_the_next_reader_removes(data, tmp_path):
    """kill -9 of the whole process group (a container's end): nothing is left to clean
    up; the next reader's start removes what the dead one left in /dev/shm, by its name:
    its blocks (and no semaphore: the processes' pipes make none, where a
    ``concurrent.futures`` pool's queues left five for good)."""
    run, mark = _start(data, tmp_path, "numpy")
    mapped: set[str] = set()
    try:
        for _ in range(3):
            _wait_for(run.stdout, "batch")
        mapped = _mapped(mark)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        assert _gone(mark)
        assert _blocks_of(run.pid)  # left by processes that died at once
        assert not any(n.startswith("sem.") for n in mapped)
        r = reader.NumpyReader(data, "train", B, num_processes=0, **OPTS)
        next(iter(r))
        assert _blocks_of(run.pid) == []
        assert _left(mapped) == []
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        for name in _left(mapped):  # (a failed run's: not this machine's for ever)
            os.unlink(os.path.join("/dev/shm", name))


def test_an_empty_block_of_a_dead_reader_is_removed_too(data):
    """A process killed between making a block and sizing it leaves an empty one, which
    cannot be mapped: the next reader's start removes it all the same (it raised
    ValueError: cannot mmap an empty file; a read's own end met the same race)."""
    owner = subprocess.run(
        [sys.executable, "-c", "from reader.cache import folder; print(folder.this_owner())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()  # a process that has ended: a dead reader
    name = f"evenshard-{owner}-0-0-0"
    open(os.path.join("/dev/shm", name), "wb").close()
    try:
        r = reader.NumpyReader(data, "train", B, num_processes=0, **OPTS)
        next(iter(r))
        assert not os.path.exists(os.path.join("/dev/shm", name))
    finally:
        with __import__("contextlib").suppress(FileNotFoundError):
            os.unlink(os.path.join("/dev/shm", name))


@pytest.mark.slow
@pytest.mark.parametrize("route", ["numpy", "make_dataset"])
def test_one_ctrl_c_ends_a_read_whatever_the_transform_does(data, tmp_path, route):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while a transform
    sleeps 30 s: the script's own KeyboardInterrupt at once, no line of the read's
    processes, no process or block left (it waited for the transform, then took three
    Ctrl-C and left both). Through TensorFlow the script's KeyboardInterrupt can be
    lost: raised in ``Executor.__del__`` (TensorFlow's, run on the main thread after a
    step), Python prints it as "Exception ignored" and drops it; the read ends all the
    same, with its own error saying so."""
    run, mark = _start(data, tmp_path, route)
    try:
        said = _wait_for(run.stderr, "transforming")
        mapped = _mapped(mark)
        os.killpg(run.pid, signal.SIGINT)
        code = run.wait(timeout=10)
        rest = [line for line in run.stderr.read().splitlines() if line != "transforming"]
        if code == 1 and route == "make_dataset" and "Executor.__del__" in "\n".join(rest):
            assert "OperationError: the read was interrupted (Ctrl-C)" in "\n".join(rest)
        else:
            assert code == 130, "".join(said) + "\n".join(rest)
            assert rest == ["interrupted"], "\n".join(rest)
        assert _gone(mark), "a process of the interrupted reader is still running"
        assert _blocks_of(run.pid) == [] and _left(mapped) == []
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def exits(example, rng):
    if example["key"].endswith("img_00003.png"):
        sys.exit(3)
    return example


def interrupts(example, rng):
    if example["key"].endswith("img_00003.png"):
        raise KeyboardInterrupt
    return example


class Unbuildable:
    """A transform that pickles here and cannot be unpickled in another process."""

    def __init__(self):
        self.pid = os.getpid()

    def __call__(self, example, rng):
        return example

    def __setstate__(self, state):
        if state["pid"] != os.getpid():
            raise ValueError("made for process only")
        self.__dict__.update(state)


@pytest.mark.parametrize(
    "transform, said",
    [
        (exits, "exits failed on key .*img_00003.png.*SystemExit: 3"),
        (interrupts, "interrupts failed on key .*img_00003.png.*KeyboardInterrupt"),
    ],
)
def test_what_a_transform_does_is_one_line_naming_the_key_and_the_function(data, transform, said):
    r = reader.NumpyReader(data, "train", B, transform=transform, num_processes=2, **OPTS)
    with pytest.raises(TransformError, match=said) as raised:
        list(r)
    assert "\n" not in str(raised.value)


def test_a_transform_that_cannot_be_rebuilt_in_a_process_is_one_line(data):
    r = reader.NumpyReader(data, "train", B, transform=Unbuildable(), num_processes=2, **OPTS)
    with pytest.raises(TransformError, match="Unbuildable cannot be rebuilt in a worker") as e:
        list(r)
    assert "ValueError: made for process only" in str(e.value)
    assert "\n" not in str(e.value)


MARKS = os.path.join(tempfile.gettempdir(), "evenshard-leave-test")


def never_lets_its_process_end(example, rng):
    """From epoch 1 on: holds the lock a worker process ends under, so its watcher cannot
    end it (as if the read's end never reached it), and sleeps; says when it starts and
    when it wakes."""
    from reader.routes import preprocess_worker

    if example["epoch"] >= 1:
        with preprocess_worker._LEAVING:
            os.makedirs(MARKS, exist_ok=True)
            open(os.path.join(MARKS, f"started-{os.getpid()}"), "w").close()
            time.sleep(60)
        open(os.path.join(MARKS, f"woke-{os.getpid()}"), "w").close()
    return example


def test_a_process_that_does_not_end_with_the_read_is_killed_not_waited_for(data, monkeypatch):
    from reader.routes import preprocess

    shutil.rmtree(MARKS, ignore_errors=True)
    monkeypatch.setattr(preprocess, "LEAVE_WAIT", 1.0)
    kw = {**OPTS, "epochs": None}
    before = set(_blocks_of(os.getpid()))  # a read of another test may be alive still
    r = reader.NumpyReader(
        data, "train", B, transform=never_lets_its_process_end, num_processes=2, **kw
    )
    batches = iter(r)
    next(batches), next(batches)  # epoch 0's (4 batches); epoch 1's first is sent now
    deadline = time.monotonic() + 60  # a bound for a hang: it comes in ms
    while not (os.path.isdir(MARKS) and os.listdir(MARKS)) and time.monotonic() < deadline:
        time.sleep(0.05)  # until a process is in the transform that holds its end
    started = os.listdir(MARKS) if os.path.isdir(MARKS) else []
    assert started, "no batch of epoch 1 reached a process"
    batches.close()  # the read left: not waited for the 60 s sleep
    pids = [int(name.split("-")[1]) for name in started]
    assert all(not os.path.exists(f"/proc/{pid}") or _zombie(pid) for pid in pids)
    assert not [n for n in os.listdir(MARKS) if n.startswith("woke-")]
    assert set(_blocks_of(os.getpid())) <= before
    shutil.rmtree(MARKS, ignore_errors=True)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# A script that exits with a read's iterator still held: a process of its read is inside
# ``never_lets_its_process_end``.
UNFINISHED = textwrap.dedent(
    """
    import os, sys, time
    import reader
    from reader.routes import preprocess
    from test_preprocess_lifecycle import MARKS, never_lets_its_process_end

    if __name__ == "__main__":
        preprocess.LEAVE_WAIT = 1.0
        kw = dict(image_size=(12, 12), seed=4, epochs=None, num_processes=2)
        r = reader.NumpyReader(sys.argv[1], "train", 4, transform=never_lets_its_process_end, **kw)
        batches = iter(r)
        next(batches), next(batches)
        while not (os.path.isdir(MARKS) and os.listdir(MARKS)):
            time.sleep(0.05)
        print("exiting", flush=True)
    """
)


def test_a_read_never_finished_does_not_hold_the_exit(data, tmp_path):
    """The process exits with the read's iterator alive: ``concurrent.futures`` would
    wait, at exit, for the batch a process is transforming; the read's processes are
    ended first (killed here, as their end is held)."""
    shutil.rmtree(MARKS, ignore_errors=True)
    script = tmp_path / "unfinished.py"
    script.write_text(UNFINISHED)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), tests]))
    done = subprocess.run(
        [sys.executable, str(script), data], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and done.stdout == "exiting\n", done.stderr[-2000:]
    assert [n for n in os.listdir(MARKS) if n.startswith("started-")]
    assert not [n for n in os.listdir(MARKS) if n.startswith("woke-")]
    shutil.rmtree(MARKS, ignore_errors=True)


# Reads that end every way a script ends them, then the script's exit: each read through
# an epoch, left by a break, or held to the exit, in 2 processes and in the script's own.
READS_THEN_EXIT = textwrap.dedent(
    """
    import os, sys
    import reader

    if __name__ == "__main__":
        held = []
        for processes in (2, 0):
            def read():
                return reader.NumpyReader(sys.argv[1], "train", 4, num_processes=processes,
                                          image_size=(12, 12), seed=4, epochs=1)
            for _ in read():
                pass
            for i, batch in enumerate(read()):
                if i == 1:
                    break
            batches = iter(read())
            held += [batches, next(batches), next(batches)]
        if sys.argv[2:] == ["faces"]:  # held too: a device's feed, TorchReader's
            from reader.torch import TorchReader

            for face in (
                reader.NumpyReader(sys.argv[1], "train", 4, image_size=(12, 12), device="cpu"),
                TorchReader(sys.argv[1], "train", 4, image_size=(12, 12), backend="python"),
            ):
                batches = iter(face)
                held += [batches, next(batches)]
        print(os.getpid(), flush=True)
    """
)


def test_reads_ended_every_way_leave_the_resource_tracker_nothing_to_clean(data, tmp_path):
    """A script's reads, 2 processes or none, read to the end, left by a break or held to
    its exit (NumpyReader's feed to a JAX device and TorchReader's too): no "leaked
    shared_memory" (or semaphore) warning from the resource tracker at its exit, no
    "Exception ignored" from a read's generator, and nothing of the script's left in
    /dev/shm; three runs, as a leak was seen in one run of three."""
    script = tmp_path / "reads.py"
    script.write_text(READS_THEN_EXIT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    for run in range(3):  # the first with the device's feed and TorchReader's held too
        done = subprocess.run(
            [sys.executable, str(script), data, *(["faces"] if run == 0 else [])],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "leaked" not in done.stderr and "resource_tracker" not in done.stderr, done.stderr
        # a read's generator left to the interpreter's teardown found its modules emptied
        assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
        pid = done.stdout.strip()
        assert [n for n in os.listdir("/dev/shm") if f"-{pid}-" in n] == []


def _noop():
    pass


def test_a_forked_child_exiting_leaves_the_parents_read_running(data):
    """A process forked while a read runs (a DataLoader worker of a validation loader)
    inherits the read: its exit must not end the read's processes."""
    import multiprocessing

    kw = {**OPTS, "epochs": 4}  # 16 batches: more than the 4 in flight at the fork
    r = reader.NumpyReader(data, "train", B, transform=None, num_processes=2, **kw)
    batches = iter(r)
    first = next(batches)
    child = multiprocessing.get_context("fork").Process(target=_noop)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert 1 + len(list(batches)) == len(r)  # the read goes on: no process of it died
    assert first["image"].shape[0] == B


def test_the_scripts_own_imports_are_made_once_in_the_fork_server(data, tmp_path):
    """Each process re-runs the training script's top (Python before 3.13 never preloads
    it in the fork server): what the script imports (torch, TensorFlow: seconds each)
    is imported once, by the server the processes fork from, not once a process."""
    lib, log = tmp_path / "lib", tmp_path / "imported_by"
    lib.mkdir()
    (lib / "heavy_stand_in.py").write_text(
        "import os\n"
        "with open(os.environ['IMPORTED_BY'], 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
    )
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            import heavy_stand_in
            import reader

            if __name__ == "__main__":
                batches = reader.NumpyReader(sys.argv[1], "train", 4, image_size=(12, 12),
                                             seed=0, epochs=1, num_processes=2)
                print(os.getpid(), sum(1 for _ in batches))
            """
        )
    )
    env = dict(os.environ, IMPORTED_BY=str(log), PYTHONPATH=f"{lib}{os.pathsep}{os.getcwd()}")
    done = subprocess.run(
        [sys.executable, str(script), data], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pid, batches = map(int, done.stdout.split())
    imported_by = [int(line) for line in log.read_text().split()]
    assert batches == 4
    # the script's process, then the fork server; neither of the read's 2 processes
    assert len(imported_by) == 2 and imported_by[0] == pid, imported_by


def test_a_script_import_the_fork_server_would_get_wrong_is_left_to_the_processes(data, tmp_path):
    """The fork server starts in the current folder with ``sys.argv == ["-c"]``, not as
    the script: a ``helpers.py`` beside the script, shadowed there by the current
    folder's, and a module that reads ``sys.argv`` at import (an IndexError there: any
    error but ImportError used to end the server, and every read with it) are imported
    by each process as before, and the read runs the script's own transform."""
    here, lib = tmp_path / "here", tmp_path / "lib"
    (here / "sub").mkdir(parents=True)
    lib.mkdir()
    (here / "helpers.py").write_text("WHO = 'the current folder'\n")
    (here / "sub" / "helpers.py").write_text(
        "def keep(example, rng):\n    return {**example, 'who': 'the script'}\n"
    )
    (lib / "argv_settings.py").write_text("import sys\nDATA = sys.argv[1]\n")
    (here / "sub" / "train.py").write_text(
        textwrap.dedent(
            """
            import argv_settings
            import helpers
            import reader

            if __name__ == "__main__":
                batches = reader.NumpyReader(argv_settings.DATA, "train", 4, seed=0, epochs=1,
                                             image_size=(12, 12), transform=helpers.keep,
                                             num_processes=2)
                print(sorted({who for b in batches for who in b["who"]}))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=f"{lib}{os.pathsep}{os.getcwd()}")
    done = subprocess.run(
        [sys.executable, "sub/train.py", data],
        capture_output=True,
        text=True,
        env=env,
        cwd=here,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "['the script']"
