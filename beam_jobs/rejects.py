"""WriteRejects and RejectGate: every input that is not written, in one file, and
whether there are few enough of them for shards to be written (``convert_core.rejects``).

``rejects/rejects.jsonl`` appears before ``dataset_info.json``
(``beam_jobs.finalize``), which adds the inputs that changed while shards were
written (``add_rejects``).
"""

from __future__ import annotations

import apache_beam as beam

from convert_core.output import write_rejects
from convert_core.rejects import gate, summary


class WriteRejects(beam.PTransform):
    """Reject -> one summary {reason: count}; writes ``rejects_file``.

    All rejects go to one file in one worker, sorted by (key, source, reason,
    detail). Rejects are few by construction
    (the job fails above --max_reject_fraction, default 1%), so this is the
    metadata of about one shard at worst.
    """

    def __init__(self, rejects_file: str):
        super().__init__()
        self._path = rejects_file

    def expand(self, rejects):
        path = self._path

        def write(all_rejects):
            write_rejects(path, all_rejects)
            return summary(all_rejects)

        return rejects | "AllRejects" >> beam.combiners.ToList() | "WriteFile" >> beam.Map(write)


class RejectGate(beam.PTransform):
    """PBegin -> {"ok", "inputs", "rejects", "max_fraction"}: may shards be written?"""

    def __init__(self, max_fraction: float, inputs, reject_summary):
        super().__init__()
        self._max = max_fraction
        self._inputs, self._summary = inputs, reject_summary

    def expand(self, pbegin):
        max_fraction = self._max

        def decide(_, inputs, reject_summary):
            return gate(max_fraction, inputs, reject_summary)

        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "Decide"
            >> beam.Map(
                decide,
                beam.pvalue.AsSingleton(self._inputs),
                beam.pvalue.AsSingleton(self._summary),
            )
        )
