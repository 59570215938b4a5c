"""Inspection a few files at a time in one worker (``InspectImage(threads=...)``): the same
Images and Rejects, in the candidates' order, as one at a time; and who gets threads."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.inspect_images import InspectImage, local_threads
from convert_core.inspection import Inspector
from convert_core.records import Candidate
from evenshard import synthetic


@pytest.fixture(scope="module")
def candidates(tmp_path_factory):
    """Good JPEGs and PNGs with every kind of bad file between them."""
    rng = np.random.default_rng(3)
    root = tmp_path_factory.mktemp("threads")
    jpeg = synthetic.image_bytes("jpeg", 48, 40, rng)
    files = {}
    for i in range(23):
        files[f"a/{i:02d}.jpg"] = synthetic.image_bytes("jpeg", 30 + i, 20 + i, rng)
        files[f"b/{i:02d}.png"] = synthetic.image_bytes("png", 10 + i, 12, rng)
    files.update(
        {
            "a/empty.jpg": b"",
            "a/text.jpg": b"not an image",
            "a/cut.jpg": jpeg[: len(jpeg) // 2],
            "a/garbled.jpg": jpeg[:120] + bytes(len(jpeg) - 120),
        }
    )
    for rel, data in files.items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(data)
    keys = sorted(files) + ["a/missing.jpg"]
    return str(root), [Candidate(k, "", "", k.split("/")[0]) for k in keys]


def _inspected(root, candidates, threads, bundles):
    """What the DoFn gives, run as Beam runs it: ``bundles`` bundles in turn."""
    fn = InspectImage(Inspector("full", 10**8, root, 10**8), threads=threads)
    fn.setup()
    out = []
    size = -(-len(candidates) // bundles)
    for start in range(0, len(candidates), size):
        fn.start_bundle()
        for c in candidates[start : start + size]:
            out.extend(fn.process(c))
        out.extend(w.value for w in fn.finish_bundle())
    fn.teardown()
    return out


@pytest.mark.parametrize("threads, bundles", [(2, 1), (3, 4), (8, 1)])
def test_threads_give_what_one_at_a_time_gives_in_order(candidates, threads, bundles):
    root, listed = candidates
    alone = _inspected(root, listed, 1, 1)
    assert [x.key for x in alone] == [c.key for c in listed]
    reasons = {x.key: x.reason for x in alone if hasattr(x, "reason")}
    assert reasons == {
        "a/empty.jpg": "empty",
        "a/text.jpg": "unsupported_format",
        "a/cut.jpg": "truncated",
        "a/garbled.jpg": "corrupt",
        "a/missing.jpg": "missing",
    }
    assert _inspected(root, listed, threads, bundles) == alone


def test_threads_in_a_pipeline(candidates):
    root, listed = candidates
    expected = _inspected(root, listed, 1, 1)
    with TestPipeline() as p:
        got = (
            p
            | beam.Create(listed)
            | beam.ParDo(InspectImage(Inspector("full", 10**8, root, 10**8), threads=3))
        )
        assert_that(got, equal_to(expected))


@pytest.mark.parametrize(
    "args, threads",
    [
        (["--runner=beam_jobs.local_runner.LocalRunner"], "cores"),
        ([], "cores"),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=1"], "cores"),
        (["--direct_running_mode=multi_processing", "--direct_num_workers=0"], 1),
        (["--direct_running_mode=multi_threading", "--direct_num_workers=64"], 1),
        (["--runner=DataflowRunner"], 1),
    ],
)
def test_local_threads_are_the_cores_over_the_workers(args, threads, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert local_threads(PipelineOptions(args)) == (4 if threads == "cores" else threads)
