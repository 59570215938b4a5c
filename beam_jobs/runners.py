"""Runner conveniences: ``--runner=dask`` with a loopback LocalCluster.

``--runner=dask`` (or Beam's class name,
``apache_beam.runners.dask.dask_runner.DaskRunner``) selects
``beam_jobs.dask_runner.DaskRunner``, Beam's with its fixes. Without
``--dask_client_address`` a ``dask.distributed.LocalCluster`` is started on
127.0.0.1 only (no dashboard), with ``--dask_workers`` worker processes
(default 2), and stopped when the job ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable

from convert_core.options import UserError
from schemas.malloc import M_ARENA_MAX, M_TRIM_THRESHOLD, mallopt

log = logging.getLogger(__name__)

# Beam's DaskRunner with each step computed once, Reshuffle spreading work and
# finish_bundle outputs kept (beam_jobs/dask_runner.py); Beam's own class name
# is taken to mean it too.
DASK_RUNNER = "beam_jobs.dask_runner.DaskRunner"
_BEAM_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_ALIASES = {name.lower(): DASK_RUNNER for name in ("dask", "DaskRunner", _BEAM_DASK_RUNNER)}
# Beam's DirectRunner hands a batch job it can run to Prism first: it downloads
# Prism's binary from GitHub (a network call and an executable the user did not
# ask for) and runs there, falling back to the FnApiRunner only when that fails
# (offline: ~0.7 s a job lost). evenshard's local runs, and every test that pins
# their bytes, are the FnApiRunner's, so no runner flag or any name Beam takes for
# its DirectRunner ("direct", "SwitchingDirectRunner", its class path) means it,
# built as the DirectRunner builds it (beam_jobs/local_runner.py).
LOCAL_RUNNER = "beam_jobs.local_runner.LocalRunner"
_DIRECT = {"directrunner", "switchingdirectrunner"}


def _direct(runner: str) -> bool:
    """Whether Beam takes ``runner`` for its DirectRunner (its names are matched as Beam
    matches them: any case, "Runner" optional, or the class's full path)."""
    module, _, name = runner.lower().rpartition(".")
    name = name if name.endswith("runner") else name + "runner"
    return name in _DIRECT and module in ("", "apache_beam.runners.direct.direct_runner")


def _flag(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """Removes ``--name=value`` or ``--name value`` from args; returns (value, rest)."""
    rest, value, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == f"--{name}" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return value, rest


@contextlib.contextmanager
def resolve_runner(pipeline_args: list[str]):
    """Yields pipeline_args with runner aliases expanded (and a LocalCluster when needed):
    no runner or the DirectRunner is ``LOCAL_RUNNER``, dask is ``DASK_RUNNER``."""
    runner, rest = _flag(list(pipeline_args), "runner")
    workers, rest = _flag(rest, "dask_workers")
    if runner is None or runner.lower() not in _ALIASES:
        if workers is not None:
            raise UserError("--dask_workers only applies to --runner=dask")
        if runner is None or _direct(runner):
            yield [f"--runner={LOCAL_RUNNER}", *rest]
        else:
            yield pipeline_args
        return
    args = [f"--runner={_ALIASES[runner.lower()]}", *rest]
    if any(a.startswith("--dask_client_address") for a in rest):
        if workers is not None:
            raise UserError(
                "--dask_workers starts a local cluster; it cannot go with --dask_client_address"
            )
        address, _ = _flag(list(rest), "dask_client_address")
        _check_reachable(address)
        yield args
        return
    try:
        n = int(workers) if workers is not None else 2
    except ValueError:
        raise UserError(f"--dask_workers must be a whole number, got {workers!r}") from None
    if n < 1:
        raise UserError(f"--dask_workers must be >= 1, got {n}")
    try:
        import dask.distributed  # noqa: F401
    except ImportError as e:
        raise UserError(f"--runner=dask needs `pip install evenshard[dask]` ({e})") from None
    # distributed logs some 36 INFO lines for a run (workers, nannies,
    # clients): its warnings are kept
    quiet = [logging.getLogger(name) for name in ("distributed", "dask")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    cluster = loopback_cluster(n)
    log.info("evenshard: started a Dask LocalCluster at %s", cluster.scheduler_address)
    try:
        yield [*args, f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def loopback_cluster(workers: int):
    """A Dask LocalCluster of ``workers`` worker processes of one thread, all on
    127.0.0.1. dashboard_address=None does not turn the dashboard off
    (dask/distributed#8136): the scheduler gets no dashboard routes, and its HTTP server
    a free port on loopback."""
    from dask.distributed import LocalCluster

    return LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        scheduler_kwargs={"dashboard": False},
    )


def _check_reachable(address: str | None) -> None:
    """A scheduler address that takes no connection stops the job at once, in one line
    (distributed retries for 30 s, then prints a long traceback)."""
    import socket

    host_port = (address or "").split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--dask_client_address must be like tcp://HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise UserError(
            f"--dask_client_address {address}: no Dask scheduler answers there "
            f"({e.strerror or e}); start one (dask scheduler) or use --runner=dask alone "
            "for a local cluster"
        ) from None


_LOCAL_FLAGS = ("--runner", "--direct_running_mode", "--direct_num_workers", "--dask")


# Measured (benchmarks/mode_bench.py, 2 cores): with worker processes forked
# ready (beam_jobs/forked_workers.py) every core ties one in-memory worker at
# 2,000 and 5,000 small images and wins at 35,000 (before, starting them cost
# ~3 s and one worker won below about 15,000).
MULTI_PROCESSING_FROM = 5_000


def local_default(pipeline_args: list[str], many_inputs: Callable[[], bool]) -> list[str]:
    """With no runner flags: the faster local mode for the input's size.

    ``many_inputs()`` (at least ``MULTI_PROCESSING_FROM``; asked only when
    no runner flag is given): ``multi_processing`` with one worker a core;
    else Beam's default, one in-memory worker. Any runner flag given by the
    user is left as it is.
    """
    if any(a.startswith(_LOCAL_FLAGS) for a in pipeline_args):
        return pipeline_args
    workers = os.cpu_count() or 1
    if workers == 1 or not many_inputs():
        return pipeline_args
    return [
        *pipeline_args,
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
    ]


# glibc gives each thread that allocates its own malloc arena (up to 8 a
# core), and Beam's processes run many threads (gRPC, data channels); freed
# memory stays in those arenas, and above the trim threshold at the top of the
# heap. Two arenas took the peak RSS of a 100k-image convert from 1.11 to
# 0.97 GB, and a 1 MiB trim threshold (glibc's adapts upward to 32 MiB) to
# 0.86 GB, at the same CPU time (benchmarks/RESULTS.md).
# {variable: (mallopt parameter, value)}.
_MALLOC = {
    "MALLOC_ARENA_MAX": (M_ARENA_MAX, "2"),
    "MALLOC_TRIM_THRESHOLD_": (M_TRIM_THRESHOLD, "1048576"),
}


# Beam imports pandas and pyarrow as it starts (its DataFrame API, Parquet, and
# their type conversions), each in a ``try: import ... except ImportError``. A
# local convert uses none of them; refused, they are not imported: about 0.6 s
# less of each process's start (the driver's, the fork server's), measured.
# MongoDB's client (mongodbio) and BigQuery's (bigquery_tools) come the same way:
# 0.15-0.3 s of CPU more a process (docs/convert.md, "Where convert's time goes").
_UNUSED_IMPORTS = (
    "pandas",
    "pyarrow",
    "pymongo",
    "bson",
    "google.cloud.bigquery",
    "google.cloud.bigquery_storage_v1",
)


def runs_locally(pipeline_args: list[str]) -> bool:
    """Whether these flags run the job on the local runner (no runner flag, or Beam's
    DirectRunner by any of its names)."""
    runner, _ = _flag(list(pipeline_args), "runner")
    return runner is None or runner == LOCAL_RUNNER or _direct(runner)


def lean_imports() -> None:
    """Refuses Beam's unused optional imports (``_UNUSED_IMPORTS``) in this process and
    the processes it forks; one already imported stays. Only for processes of
    evenshard's own that run the local runner (the CLI's convert, the fork server):
    a user's process may want them."""
    for name in _UNUSED_IMPORTS:
        sys.modules.setdefault(name, None)
    # its warning that MongoDB IO is unavailable (bson refused) is no news here
    logging.getLogger("apache_beam.io.mongodbio").setLevel(logging.ERROR)


def lean_malloc() -> None:
    """Caps glibc's malloc arenas and trim threshold here and in the workers started (Linux).

    Worker processes inherit the environment variables (values the user set
    are kept); this process, already running, is set with ``mallopt``.
    """
    if not sys.platform.startswith("linux"):
        return
    for name, (param, value) in _MALLOC.items():
        os.environ.setdefault(name, value)
        try:
            mallopt([(param, int(os.environ[name]))])
        except ValueError:  # a value the user set that is no number: theirs to mend
            pass


def describe(beam_options) -> str:
    """The runner and its workers in words, for the summary."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    runner = beam_options.view_as(StandardOptions).runner or "DirectRunner"
    name = runner.rsplit(".", 1)[-1]
    if name in ("DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "LocalRunner"):
        name = "DirectRunner"  # the FnApiRunner is the DirectRunner's engine: the name users know
        direct = beam_options.view_as(DirectOptions)
        workers = direct.direct_num_workers or os.cpu_count()
        mode = direct.direct_running_mode
        return f"{name} ({mode}, {workers} worker{'s' if workers != 1 else ''})"
    address = beam_options.get_all_options().get("address")  # --dask_client_address
    if name == "DaskRunner" and address:
        return f"{name} ({address}, {_dask_workers(address)})"
    return name


def _dask_workers(address: str) -> str:
    """ "N workers" of the Dask cluster at ``address``, asked of its scheduler."""
    try:
        from dask.distributed import Client

        with Client(address, timeout=10) as client:
            n = len(client.scheduler_info()["workers"])
    except Exception as e:  # noqa: BLE001 - the summary says what it could not learn
        return f"workers unknown: {type(e).__name__}"
    return f"{n} worker{'s' if n != 1 else ''}"
