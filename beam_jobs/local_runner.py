"""The local runner: Beam's FnApiRunner, built as Beam's DirectRunner builds it, without
the DirectRunner's first try of Prism (``beam_jobs.runners.LOCAL_RUNNER``); its worker
processes forked ready when the driver runs a fork server (``beam_jobs.forked_workers``)."""

from __future__ import annotations

import os
import shlex
import sys
import threading

from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability import local_job_service
from apache_beam.runners.portability.fn_api_runner import fn_runner, worker_handlers
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.transforms import environments

from beam_jobs import compat_beam, forked_workers


@worker_handlers.WorkerHandler.register_environment(python_urns.SUBPROCESS_SDK, bytes)
class _SubprocessWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
    """Beam's handler of a worker process, failing what the worker was asked when its
    process ends early (killed, out of memory, crashed).

    Beam's only logs the exit code: a bundle the worker held then waits for its
    answer forever, and the job hangs (a bundle reading the runner's data fails on
    the closed channel; one that reads none, such as a step's first, does not).
    Beam's Docker handler fails them this way (``control_conn.abort``); a request
    sent to the worker after that fails at once too (abort fails those sent before).
    """

    def start_worker(self):
        self.worker = local_job_service.SubprocessSdkWorker(
            compat_beam.worker_command(self),
            self.control_address,
            self.provision_info,
            self.worker_id,
        )
        self.worker_thread = threading.Thread(name="run_worker", target=self._run, daemon=True)
        self.worker_thread.start()

    def _run(self):
        try:
            self.worker.run()
        except Exception as e:  # noqa: BLE001 - every early end fails the job, in words
            lost = forked_workers.WorkerLost.of(self.worker_id, str(e))
            _LOST.append(lost)
            conn, push = self.control_conn, self.control_conn.push

            def refused(request):  # a request sent to the dead worker later fails too
                future = push(request)
                if future is not None:
                    future.abort(lost)
                return future

            conn.push = refused
            conn.abort(lost)


_LOST: list[forked_workers.WorkerLost] = []  # the workers of the run that ended early
# The runner's threads that read a worker's gRPC streams: a worker gone breaks them,
# each printing a traceback of a bare ``grpc.RpcError`` (the run fails with WorkerLost).
_STREAM_READERS = ("read_grpc_client_inputs", "beam_control_read")


def _quiet_broken_streams(hook):
    import grpc

    def quiet(args):
        thread = getattr(args.thread, "name", "")
        if not (thread in _STREAM_READERS and isinstance(args.exc_value, grpc.RpcError)):
            hook(args)

    return quiet


class LocalRunner(fn_runner.FnApiRunner):
    """The FnApiRunner with the job's options in its provision info, as the DirectRunner
    gives it: worker processes (``multi_processing``) start with them, so their file
    systems see the run's flags (``--s3_endpoint_url``, say). A bare FnApiRunner gives
    its workers none. With a fork server (``forked_workers.ENV``) those workers are
    its forks, started by its client instead of ``python -m ...sdk_worker_main``."""

    def run_pipeline(self, pipeline, options):
        """Runs the pipeline; a worker process that ended early fails it with one
        ``WorkerLost`` naming the worker, whatever the bundles it held then raised."""
        _LOST.clear()
        hook = threading.excepthook
        threading.excepthook = _quiet_broken_streams(hook)
        try:
            return self._run_pipeline(pipeline, options)
        except Exception:
            if _LOST:
                raise _LOST[0] from None
            raise
        finally:
            threading.excepthook = hook

    def _run_pipeline(self, pipeline, options):
        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        info = fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
        )
        compat_beam.set_runner_defaults(self, provision_info=info)
        direct = options.view_as(DirectOptions)
        if direct.direct_running_mode != "multi_processing":
            return super().run_pipeline(pipeline, options)
        # The FnApiRunner sets its workers' command from the running mode alone: with
        # no mode it keeps the environment given here. Without a server, Beam's own
        # command, exec'd: the shell Beam starts it with neither outlives nor reports
        # the worker ("Killed"), and its exit code is the worker's (-9: SIGKILL).
        server = os.environ.get(forked_workers.ENV)
        own = f"exec {shlex.quote(sys.executable)} -m apache_beam.runners.worker.sdk_worker_main"
        environment = environments.SubprocessSDKEnvironment.from_command_string(
            forked_workers.command(server) if server else own
        )
        compat_beam.set_runner_defaults(self, environment=environment)
        direct.direct_running_mode = None
        try:
            return super().run_pipeline(pipeline, options)
        finally:
            direct.direct_running_mode = "multi_processing"
