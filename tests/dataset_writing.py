"""Datasets written as ``evenshard convert`` writes them, without running Beam.

The reader tests need small finished datasets; converting each through a Beam
pipeline (and ``validate --full``) was most of the suite's time, and tested
Beam again in files whose subject is the reader. ``write_dataset`` takes
convert's own flags for a local image folder or CSV/JSONL manifest and writes
the same folder: the shards (the format's framing, ``schemas.tfrecord``, and
Example codec, ``schemas.example``), their DALI indexes, ``schema.pbtxt``,
``labels.txt``, the rejects file and ``dataset_info.json``.

It is convert without the pipeline, not a second implementation of it: the
listing and input rules (``CandidateRules``, ``walk``, ``rows_of``), the image
rules (``schemas.images.inspect_stream``), the split rule (``hash_split``,
``cut_points``), the shard count (``shard_count``), the fingerprints, the
record encoding (``write.example_bytes``) and the info (``finalize.settings``,
``finalize.dataset_info``) are convert's own functions, called in one process.
Only what Beam distributes is done here in one place: the exact rank (a sort
by fingerprint, ties by key), the deal to shards and the counts.
``tests/test_dataset_writer.py`` pins that a real convert writes the same bytes,
file by file, for every option this supports.

Not supported (a ``ValueError`` names what to use instead): record inputs,
``--dedupe``, symlinks in the image folder, URLs, Beam's own flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib

import schemas
from beam_jobs.inspect_images import InspectImage
from convert_core import describe as finalize
from convert_core import paths, walk
from convert_core.candidates import rows_of
from convert_core.files import LOCAL
from convert_core.fingerprint import fp, unit
from convert_core.job import Job
from convert_core.options import parse_args
from convert_core.plan_shards import estimated_record_bytes, shard_count
from convert_core.preflight import preflight
from convert_core.records import Candidate, Image, Reject, make_reject
from convert_core.split import HASH_BUCKETS, cut_points, hash_split, pick
from convert_core.write import example_bytes
from schemas import layout, tfrecord

# Beam's flags the tests pass to convert: they choose how it runs, never what it writes.
_RUNNER_FLAGS = ("--direct_running_mode", "--direct_num_workers")
_MARKER = b"evenshard convert writes this folder\n"  # beam_jobs.output writes it first


def write_dataset(input_path: str, output_dir: str, *flags: str) -> dict:
    """Writes the dataset ``convert --input=INPUT --output_dir=OUT FLAGS`` writes.

    Args:
        input_path: a local image folder (label = first-level sub-folder) or a
            CSV/JSONL manifest.
        output_dir: a new or empty local folder.
        flags: convert's flags, as ``run_convert`` takes them (its default
            ``--max_reject_fraction=0.05`` applies here too).

    Returns:
        The dataset info, as ``convert.run`` returns it (without ``runner``).

    Raises:
        ValueError: an option this writer does not do, or too many rejects.
    """
    flags = tuple(f for f in flags if not f.startswith(_RUNNER_FLAGS))
    if not any(f.startswith("--max_reject_fraction") for f in flags):
        flags += ("--max_reject_fraction=0.05",)
    options, beam_args = parse_args([f"--input={input_path}", f"--output_dir={output_dir}", *flags])
    _check_supported(options, beam_args)
    job = preflight(Job.of(options), LOCAL)
    listed = _listing(job)
    candidates = [c for c in listed if isinstance(c, Candidate)]
    rejects = [r for r in listed if isinstance(r, Reject)]
    candidates, duplicates = _unique(job.input_root, candidates)
    rejects += duplicates
    inspect = _inspector(job)
    images = []
    for c in candidates:
        for found in inspect.process(c):
            (images if isinstance(found, Image) else rejects).append(found)
    summary = _summary(rejects)
    gate = {
        "ok": len(rejects) <= options.max_reject_fraction * len(listed),
        "inputs": len(listed),
        "rejects": len(rejects),
        "max_fraction": options.max_reject_fraction,
    }
    if not gate["ok"]:
        raise ValueError(
            f"{len(rejects)} of {len(listed)} inputs rejected ({summary}): above "
            f"--max_reject_fraction={options.max_reject_fraction}; convert writes no dataset"
        )
    vocab = _vocabulary(job, images)
    plan = _plan(options, _splits(options, images))
    label_ids = {label: i for i, label in enumerate(vocab["labels"])}
    out = job.output_dir
    os.makedirs(f"{out}/rejects", exist_ok=True)
    _put(out, layout.MARKER_FILE, _MARKER)
    shards = [
        _write_shard(job, split, index, members, label_ids, len(plan[split]["shards"]))
        for split in sorted(plan)
        for index, members in enumerate(plan[split]["shards"])
    ]
    lines = "".join(r.to_json() + "\n" for r in sorted(rejects))
    _put(out, layout.REJECTS_FILE, lines.encode("utf-8"))
    info = finalize.dataset_info(
        finalize.settings(options, job.path_root), shards, plan, vocab, gate, summary
    )
    schema = schemas.dataset_schema(options.record_kind, vocab["labels"], vocab["formats"])
    _put(out, layout.SCHEMA_FILE, schemas.to_text(schema).encode("utf-8"))
    _put(out, layout.LABELS_FILE, "".join(f"{label}\n" for label in vocab["labels"]).encode())
    text = json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    _put(out, layout.INFO_FILE, text.encode("utf-8"))  # last, as convert writes it
    return schemas.load_info(out)


def _check_supported(options, beam_args: list[str]) -> None:
    """What this writer does not do: each is Beam's or convert's to test."""
    unsupported = [
        (beam_args, f"Beam's flags {beam_args}"),
        (options.input_format != "images", f"--input_format={options.input_format}"),
        (options.dedupe != "none", f"--dedupe={options.dedupe}"),
        (paths.is_url(options.input) or paths.is_url(options.output_dir), "URLs"),
    ]
    for found, what in unsupported:
        if found:
            raise ValueError(f"write_dataset does not do {what}: use conftest.run_convert")


def _listing(job: Job) -> list[Candidate | Reject]:
    """Every input, as convert's ReadInputs lists it (before duplicates are dropped)."""
    rules = job.candidate_rules()
    if job.manifest is not None:
        with LOCAL.open_text(job.manifest, errors="surrogateescape") as f:
            return [rules.row(number, row) for number, row in rows_of(job.manifest, f)]
    links: list[str] = []
    unlisted: list[str] = []
    listed = []
    for kind, name in walk.listing_work(job.input_root):
        tree = walk.walk_tree(job.input_root, name, links, unlisted, recurse=kind == "tree")
        for source, rejected in tree:
            if rejected is None:
                listed.append(rules.file(source))
            else:
                rel = paths.relative_to(job.input_root, source) or source
                listed.append(make_reject(rel, source, *rejected))
    if links or unlisted:
        raise ValueError("write_dataset does not follow symlinks: use conftest.run_convert")
    return listed


def _unique(root: str, candidates: list[Candidate]) -> tuple[list[Candidate], list[Reject]]:
    """A manifest's rows: a key, then a file, kept once (the lowest row), as convert's
    ``_KeepFirst`` keeps them; groups are convert's to test."""
    if any(c.group is not None for c in candidates):
        raise ValueError("write_dataset does not do --group_by: use conftest.run_convert")
    kept: list[Candidate] = []
    rejects: list[Reject] = []
    for reason, identity in (
        ("duplicate_key", lambda c: c.key),
        ("duplicate_file", lambda c: os.path.realpath(paths.full_source(root, c.source, c.key))),
    ):
        first: dict[str, Candidate] = {}
        for c in sorted(candidates, key=lambda c: (c.row, c.key, c.source)):
            seen = first.setdefault(identity(c), c)
            if seen is c:
                continue
            if reason == "duplicate_key":
                detail = f"row {c.row}: key also at row {seen.row}"
            else:
                detail = f"row {c.row}: the same file as row {seen.row} (key {seen.key})"
            source = paths.full_source(root, c.source, c.key)
            rejects.append(make_reject(c.key, source, reason, detail))
        candidates = kept = [c for c in candidates if first[identity(c)] is c]
    return kept, rejects


def _inspector(job: Job) -> InspectImage:
    """Convert's own inspection (``InspectImages``' DoFn), called directly."""
    o = job.options
    inspect = InspectImage(
        o.verify, o.max_image_pixels, job.input_root, int(o.max_image_mb * 10**6)
    )
    inspect.setup()
    return inspect


def _summary(rejects: list[Reject]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rejects:
        counts[r.reason] = counts.get(r.reason, 0) + 1
    return dict(sorted(counts.items()))


def _vocabulary(job: Job, images: list[Image]) -> dict:
    labels = list(job.vocabulary) if job.vocabulary else sorted({im.label for im in images})
    return {"labels": labels, "formats": sorted({im.format for im in images})}


def _ranked(seed: int, purpose: str, images: list[Image]) -> list[Image]:
    """Images in the order of their fingerprint, ties broken by key (``rank.sort_key``)."""
    return sorted(images, key=lambda im: (fp(seed, purpose, im.key), im.key))


def _splits(options, images: list[Image]) -> dict[str, list[Image]]:
    """split -> its images: convert's ``AssignSplits``, a split given by a row winning."""
    names, fractions = options.split_names, list(options.split_fractions)
    out: dict[str, list[Image]] = {}
    if options.split_mode == "hash":
        cuts = cut_points(fractions, HASH_BUCKETS)
        for im in images:
            split = im.split or hash_split(im, names, cuts, options.split_seed)
            out.setdefault(split, []).append(im)
        return out
    by_label: dict[str, list[Image]] = {}
    for im in images:
        if im.split is not None:
            out.setdefault(im.split, []).append(im)
        else:
            by_label.setdefault(im.label, []).append(im)
    for members in by_label.values():
        cuts = cut_points(fractions, len(members))
        for rank, im in enumerate(_ranked(options.split_seed, "split", members)):
            out.setdefault(names[pick(cuts, rank)], []).append(im)
    return out


def _plan(options, splits: dict[str, list[Image]]) -> dict:
    """split -> convert's plan (``PlanShards``) and the images of each shard in order
    (``OrderAndShard``): balance none, a rank range a shard; balance label, labels
    laid end to end and dealt round-robin, each shard ordered by position."""
    plan = {}
    for split in sorted(set(options.split_names) | set(splits)):
        members = splits.get(split, [])
        labels: dict[str, int] = {}
        for im in members:
            labels[im.label] = labels.get(im.label, 0) + 1
        est = sum(estimated_record_bytes(im, options.record_kind) for im in members)
        n = len(members)
        count = shard_count(
            n,
            est,
            options.target_shard_mb * 1e6,
            options.shard_multiple,
            options.num_shards,
            options.examples_per_shard,
        )
        shards: list[list] = [[] for _ in range(count)]
        if options.balance == "none":
            for rank, im in enumerate(_ranked(options.seed, "order", members)):
                shards[rank * count // n].append((rank, im))
        else:
            offset = 0
            for label, size in sorted(labels.items()):
                ranked = _ranked(options.seed, "order", [m for m in members if m.label == label])
                for i, im in enumerate(ranked):
                    position = (i + unit(options.seed, "jitter", im.key)) / size
                    key = (position, fp(options.seed, "order", im.key))
                    shards[(offset + i) % count].append((key, im))
                offset += size
        plan[split] = {
            "num_examples": n,
            "label_counts": dict(sorted(labels.items())),
            "shards": [[im for _, im in sorted(s, key=lambda e: (e[0], e[1].key))] for s in shards],
        }
    return plan


def _write_shard(job: Job, split: str, index: int, images, label_ids, count: int) -> dict:
    """One shard file and its DALI index; its entry in the info, as ``WriteShards``'."""
    o = job.options
    name = layout.shard_name(split, index, count, o.compression)
    gzip = (
        zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if o.compression == "gzip" else None
    )
    pieces, lengths, labels = [], [], {}
    for im in images:
        data = None
        if o.record_kind == "image":
            with open(paths.full_source(job.input_root, im.source, im.key), "rb") as f:
                data = f.read()
        record = example_bytes(im, label_ids[im.label], o.record_kind, data)
        framed = tfrecord.frame(record)
        pieces.append(gzip.compress(framed) if gzip else framed)
        lengths.append(len(record))
        labels[im.label] = labels.get(im.label, 0) + 1
    if gzip:
        pieces.append(gzip.flush())
    body = b"".join(pieces)
    _put(job.output_dir, name, body)
    index_file = layout.index_name(name)
    if index_file:
        _put(job.output_dir, index_file, tfrecord.index_text(lengths))
    return {
        "split": split,
        "index": index,
        "file": name,
        **({"dali_index": index_file} if index_file else {}),
        "num_examples": len(images),
        "num_bytes": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "label_counts": dict(sorted(labels.items())),
    }


def _put(out: str, name: str, data: bytes) -> None:
    with open(layout.join(out, name), "wb") as f:
        f.write(data)
