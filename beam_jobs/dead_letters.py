"""Dead letters that work on every runner.

A step yields either its result or a :class:`Reject`, on ONE output, and
``SplitRejects`` separates them with two Filters. This is not
``ParDo.with_outputs`` with ``TaggedOutput``, the usual Beam idiom, because
Beam's DaskRunner keys its bags by transform rather than by output tag: every
consumer of a multi-output ParDo there receives all of its outputs, so tagged
rejects would leak into the main output. (``beam.Partition`` is a
multi-output ParDo too.) Two fused Filters cost next to nothing elsewhere.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from convert_core.records import Reject


def _is_reject(element) -> bool:
    if isinstance(element, Reject):
        # every reject passes here once: the one place its reason is counted
        Metrics.counter("evenshard", f"rejected_{element.reason}").inc()
        return True
    return False


def _is_result(element) -> bool:
    return not isinstance(element, Reject)


class SplitRejects(beam.PTransform):
    """result | Reject -> {"main": results, "rejects": Rejects}; counts each reject in the
    Beam metric ``rejected_REASON``."""

    def expand(self, mixed):
        return {
            "main": mixed | "Results" >> beam.Filter(_is_result),
            "rejects": mixed | "Rejects" >> beam.Filter(_is_reject),
        }
