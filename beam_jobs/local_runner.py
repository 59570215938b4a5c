"""The local runner: Beam's FnApiRunner, built as Beam's DirectRunner builds it, without
the DirectRunner's first try of Prism (``beam_jobs.runners.LOCAL_RUNNER``)."""

from __future__ import annotations

from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle


class LocalRunner(fn_runner.FnApiRunner):
    """The FnApiRunner with the job's options in its provision info, as the DirectRunner
    gives it: worker processes (``multi_processing``) start with them, so their file
    systems see the run's flags (``--s3_endpoint_url``, say). A bare FnApiRunner gives
    its workers none."""

    def run_pipeline(self, pipeline, options):
        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        self._provision_info = fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
        )
        return super().run_pipeline(pipeline, options)
