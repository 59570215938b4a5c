"""The convert pipeline: ``build`` wires its composite transforms, nothing else.

Each step is a ``beam.PTransform`` in a module of its own (sources,
inspect_images, dedupe, near, vocabulary, split, order; write holds the steps that
write the output folder: the rejects, the shards, the description) and is given
the values it uses, taken from the ``Job`` (its paths resolved there, once).
Totals and shard counts are computed in the pipeline and passed to the steps as
side inputs. Element shapes between the steps are in the comments.
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs.dedupe import DedupeContent
from beam_jobs.inspect_images import InspectImages
from beam_jobs.near_duplicates import NearDuplicates, SplitRule
from beam_jobs.order import OrderAndShard
from beam_jobs.plan_shards import PlanShards
from beam_jobs.record_formats import record_format
from beam_jobs.record_source import ReadRecordFiles
from beam_jobs.sources import ReadInputs
from beam_jobs.split import AssignSplits
from beam_jobs.vocabulary import Vocabulary
from beam_jobs.write import Finalize, RejectGate, WriteRejects, WriteShards
from convert_core.inspection import Inspector
from convert_core.job import Job
from convert_core.record_rules import RecordRules, is_glob
from convert_core.write import Shards
from schemas.errors import InvalidValueError


def build(pipeline, job: Job):
    """Wires the conversion of ``job`` onto ``pipeline``; returns the PCollection of the
    dataset info."""
    o = job.options
    if job.rules is None:  # (convert's driver always checks the Job first)
        raise InvalidValueError(
            "steps.build takes a Job checked by convert_core.preflight.preflight"
        )
    inspect = InspectImages(Inspector.of(job), o.near_embedding)
    if job.records:
        # -> Image | Reject, a record each (its image inspected as it is read)
        inputs = pipeline | "ReadRecords" >> ReadRecordFiles(
            record_format(o.input_format),
            job.records,
            job.input_root,
            not is_glob(o.input),
            RecordRules(
                job.features,
                job.vocabulary,
                "--labels" if o.labels_file else "the data's class names",
            ),
            inspect.arguments,
            job.incomplete_dir,
        )
        images, rejected = inputs["main"], [inputs["rejects"]]
    else:
        inputs = pipeline | "ReadInputs" >> ReadInputs(job.rules, job.manifest)
        # Candidate -> Image | Reject
        inspected = inputs["main"] | "InspectImages" >> inspect
        images = inspected["main"]
        rejected = [inputs["rejects"], inspected["rejects"]]
    if o.dedupe == "content":
        unique = images | "DedupeContent" >> DedupeContent(job.input_root)
        images = unique["main"]
        rejected.append(unique["rejects"])
    near = None
    if o.dedupe == "near":
        clustered = images | "NearDuplicates" >> NearDuplicates(
            o.near_distance,
            o.near_keep,
            o.group_by is not None,
            job.input_root,
            SplitRule(*job.splits, o.split_seed),
            embedding=(o.near_embedding, o.near_threshold) if o.near_embedding else None,
        )
        images, near = clustered["main"], clustered["summary"]
        rejected.append(clustered["rejects"])
    rejects = tuple(rejected) | "AllRejects" >> beam.Flatten()
    reject_summary = rejects | "WriteRejects" >> WriteRejects(job.rejects_file)
    gate = pipeline | "RejectGate" >> RejectGate(
        o.max_reject_fraction, inputs["inputs"], reject_summary
    )
    int_labels = job.features is not None and job.features.label_kind == "int64"
    vocab = images | "Vocabulary" >> Vocabulary(job.vocabulary, numbered=int_labels)
    # Image -> (split, Image)
    split_images = images | "AssignSplits" >> AssignSplits(*job.splits, o.split_mode, o.split_seed)
    plan = split_images | "PlanShards" >> PlanShards(
        job.splits[0],
        o.record_kind,
        o.target_shard_mb,
        o.shard_multiple,
        o.num_shards,
        o.seed,
        o.balance,
        examples_per_shard=o.examples_per_shard,
    )
    # (split, Image) -> ((split, shard), [Image] in order)
    sharded = split_images | "OrderAndShard" >> OrderAndShard(o.seed, o.balance, plan)
    # -> shard info dicts | Reject (an input that changed since inspection)
    written = sharded | "WriteShards" >> WriteShards(
        Shards.of(job),
        record_image=(
            (record_format(o.input_format).images_again, job.features.image)
            if job.features
            else None
        ),
        plan=plan,
        vocab=vocab,
        gate=gate,
    )
    return pipeline | "Finalize" >> Finalize(
        job.output_dir,
        job.rejects_file,
        job.incomplete_dir,
        job.settings,
        shards=written["main"],
        changed=written["rejects"],
        plan=plan,
        vocab=vocab,
        gate=gate,
        reject_summary=reject_summary,
        near=near,
    )
