"""Validation of a dataset (``evenshard validate``): is it what dataset_info.json says?

Quick checks: dataset_info.json present and well-formed; every listed shard
exists with its recorded size and sha256; no stray shard files, nothing left in
``.incomplete/`` (a bucket too, where it is a prefix); records per
shard and labels per shard, counted from the files (every CRC checked);
inputs = written + rejects, and the rejects file agrees.
``--full`` adds: every record parses against schema.pbtxt (types, value
counts, domains, no missing or extra features); image kind: every image
decodes; path kind: every path resolves under path_root; example kind (records
written as they were): every record against the schema inferred from them
(``schemas.inferred.check_record``: presence, types, value counts, no extra feature),
its labels from the ``label_feature`` dataset_info.json names.

Every problem is one line naming the file (and record index).
"""

from __future__ import annotations

import dataclasses

from schemas import features, layout, near, storage, tfrecord
from schemas.dataset_info import DatasetInfo, ShardInfo, load_dataset_info
from schemas.example import parse_example
from schemas.info import DatasetError
from schemas.progress import Progress

INFO = layout.INFO_FILE
BATCH = 512
MISSING_SHOWN = 10  # path records: images named when they are missing; the rest counted


class _Missing:
    """The images of path records that are not there: the first few named, all counted,
    and one line with the fix (they moved: ``--path_root``)."""

    def __init__(self):
        self.count = 0
        self.named: list[str] = []

    def add(self, line: str) -> None:
        self.count += 1
        if len(self.named) < MISSING_SHOWN:
            self.named.append(line)

    def problems(self, root: str) -> list[str]:
        if not self.count:
            return []
        return self.named + [
            f"{root}: {self.count:,} image(s) of path records missing here "
            f"({len(self.named)} named above); if the images moved, pass "
            "--path_root=THEIR_NEW_FOLDER"
        ]


def _label_schema():
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    f = schema.feature.add(name=features.LABEL, type=schema_pb2.INT)
    f.shape.dim.add(size=1)
    return schema


def _labels_of(records: list[bytes], decoder_schema) -> list[int | None]:
    from schemas.example_check import _decoder

    try:
        column = _decoder(decoder_schema).DecodeBatch(records).column(0).to_pylist()
    except Exception:  # noqa: BLE001 - a wrong type: --full names the record
        return [None] * len(records)
    return [v[0] if v and len(v) == 1 else None for v in column]


def validate(
    data_dir: str, full: bool = False, progress=None, path_root: str | None = None
) -> list[str]:
    """Returns the problems of a dataset, one line each (empty: valid).

    Args:
        path_root: path kind, ``full``: where the images are now, when they
            moved after the conversion (default: the recorded path_root).
    """
    import schemas
    from schemas.example_check import check_examples

    out = data_dir.rstrip("/")
    info_path = layout.join(out, INFO)
    if not storage.isdir(out):
        return [f"{out}: not a folder"]
    try:
        info = load_dataset_info(out)
    except (DatasetError, OSError) as e:
        return [str(e)]
    if path_root is not None:
        info = dataclasses.replace(info, path_root=path_root.rstrip("/"))

    problems: list[str] = []
    schema = None
    if full:
        try:
            schema = schemas.load(out)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            problems.append(f"{layout.join(out, layout.SCHEMA_FILE)}: cannot be read: {e}")
    labels = info.labels
    total = sum(s.num_examples for s in info.splits)
    progress = progress or Progress("validate", "records", total)
    listed = set()
    written = 0
    label_schema = _label_schema()
    missing = _Missing()
    for s in info.splits:
        split = s.name
        split_labels: dict[str, int] = {}
        for shard in s.shards:
            listed.update((shard.file, shard.dali_index, shard.near))
            path = layout.join(out, shard.file)
            problems += _check_shard(
                path,
                shard,
                info,
                labels,
                schema,
                label_schema,
                split_labels,
                progress,
                check_examples,
                missing,
            )
        written += s.num_examples
        if sum(sh.num_examples for sh in s.shards) != s.num_examples:
            problems.append(
                f"{info_path}: split {split}: num_examples {s.num_examples} is "
                "not the sum of its shards"
            )
        recorded = {k: v for k, v in s.label_counts.items() if v}
        if split_labels and split_labels != recorded:
            problems.append(
                f"{info_path}: split {split}: label_counts {recorded} but the "
                f"shards hold {split_labels}"
            )
    problems += missing.problems(info.path_root or "")
    problems += _check_strays(out, listed)
    problems += _check_rejects(out, info, written)
    return problems


def _check_shard(
    path, shard, info, labels, schema, label_schema, split_labels, progress, check_examples, missing
) -> list[str]:
    if not storage.exists(path):
        return [f"{path}: listed in {INFO} but missing"]
    problems = []
    counts: dict[str, int] = {}
    n = 0
    batch: list[bytes] = []
    lengths: list[int] = []
    keys: list[bytes] = []  # with a .near file: its lines name them in this order

    def flush():
        first = n - len(batch)
        if shard.near:
            keys.extend(_key_of(record) for record in batch)
        if info.record_kind == "example":  # the records as they were: no image
            problems.extend(_check_examples(path, batch, first, info, labels, schema, counts))
            progress.add(len(batch))
            batch.clear()
            return
        for j, label in enumerate(_labels_of(batch, label_schema)):
            name = labels[label] if label is not None and 0 <= label < len(labels) else None
            if name is None:
                problems.append(
                    f"{path}: record {first + j}: label id missing or outside labels.txt"
                )
                continue
            counts[name] = counts.get(name, 0) + 1
        if schema is not None:
            for index, problem in check_examples(batch, schema, first):
                problems.append(f"{path}: record {index}: {problem}")
        if schema is not None or info.record_kind == "path":
            problems.extend(_check_content(path, batch, first, info, schema is not None, missing))
        progress.add(len(batch))
        batch.clear()

    # One pass over the file: size and sha256 are taken from the bytes the
    # records are read from.
    with storage.open_binary(path) as raw:
        hashed = tfrecord.HashingReader(raw)
        try:
            for record in tfrecord.iter_records(path, raw=hashed):
                batch.append(record)
                lengths.append(len(record))
                n += 1
                if len(batch) >= BATCH:
                    flush()
        except tfrecord.CorruptRecord as e:
            problems.append(f"{path}: record {e.index}: {e.problem}")
        hashed.drain()
    if batch:
        flush()
    if hashed.num_bytes != shard.num_bytes:
        problems.append(f"{path}: {hashed.num_bytes} bytes, {INFO} records {shard.num_bytes}")
    if hashed.sha256.hexdigest() != shard.sha256:
        problems.append(f"{path}: sha256 differs from {INFO} (the file changed)")
    if n != shard.num_examples:
        problems.append(f"{path}: {n} readable records, {INFO} records {shard.num_examples}")
    recorded = {k: v for k, v in shard.label_counts.items() if v}
    if counts != recorded:
        problems.append(f"{path}: label counts {counts} differ from {INFO} {recorded}")
    problems += _check_dali_index(path, shard, lengths)
    problems += _check_near(path, shard, keys, near.sidecar_chars(info.near_duplicates))
    for k, v in counts.items():
        split_labels[k] = split_labels.get(k, 0) + v
    return problems


def _check_examples(path, records, first, info, labels, schema, counts) -> list[str]:
    """Example kind: each record's label (``info.label_feature``: an int is its id in
    ``labels``, a text itself) counted into ``counts``; with ``schema`` (``--full``) each
    record checked against it."""
    from schemas.example import parse_features
    from schemas.inferred import check_record

    feature = info.label_feature
    problems = []
    for i, raw in enumerate(records):
        where = f"{path}: record {first + i}"
        try:
            found = parse_features(raw)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        if schema is not None:
            problems.extend(f"{where}: {p}" for p in check_record(found, schema))
        if not feature:
            continue
        kind, values = found.get(feature, ("", []))
        value = values[0] if len(values) == 1 else None
        if kind == "int64" and value is not None and 0 <= value < len(labels):
            name = labels[value]
        elif kind == "bytes" and value is not None:
            name = value.decode("utf-8", "replace")
        else:
            problems.append(f"{where}: label feature {feature} missing or outside labels.txt")
            continue
        counts[name] = counts.get(name, 0) + 1
    return problems


def _check_content(
    path: str, records: list[bytes], first: int, info: DatasetInfo, full: bool, missing: _Missing
) -> list[str]:
    """Path kind: every path resolves (an image that is gone goes to ``missing``), and
    with ``full`` its image decodes as the record says. Image kind, ``full``:
    every image decodes as the record says."""
    tf = storage.tensorflow() if full else None
    root = (info.path_root or "").rstrip("/")
    problems = []
    for i, raw in enumerate(records):
        try:
            feature = parse_example(raw)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, reported
            problems.append(f"{path}: record {first + i}: not a tf.train.Example: {e}")
            continue
        if info.record_kind == "image":
            data = feature.get(features.ENCODED, b"")
        else:
            target = f"{root}/{feature.get(features.PATH, b'').decode(errors='replace')}"
            if not feature.get(features.PATH) or not storage.exists(target):
                missing.add(f"{path}: record {first + i}: image {target} is missing")
                continue
            if not full:
                continue
            try:
                data = storage.read_bytes(target)
            except OSError as e:
                problems.append(f"{path}: record {first + i}: image {target} cannot be read: {e}")
                continue
        problem = _decode_problem(tf, data, feature)
        if problem:
            problems.append(f"{path}: record {first + i}: {problem}")
    return problems


def _decode_problem(tf, data: bytes, feature) -> str | None:
    """Checks an image by convert's rules (``schemas.images``), then decodes it as the
    reader does (TensorFlow) and checks it against its record."""
    import io

    from schemas.images import Rejected, inspect_stream

    try:  # TensorFlow aborts the process on some animated WebP: the rules refuse them first
        inspect_stream(io.BytesIO(data), len(data), full=True, max_pixels=1 << 62)
    except Rejected as r:
        return f"image does not decode by convert's rules ({r.reason}): {r.detail}"
    try:
        image = tf.io.decode_image(data, channels=0, expand_animations=False)
    except tf.errors.OpError as e:
        return f"image does not decode in the reader: {e.message.splitlines()[0]}"
    got = tuple(int(d) for d in image.shape)

    recorded = tuple(feature.get(k) for k in (features.HEIGHT, features.WIDTH, features.CHANNELS))
    if got != recorded:
        return f"image decodes to {got} (height, width, channels), the record says {recorded}"
    return None


def _check_dali_index(path: str, shard: ShardInfo, lengths: list[int]) -> list[str]:
    """The DALI index beside an uncompressed shard describes it as the readers check it
    (the count ``dataset_info.json`` lists, the shard's size), and the records read.

    A shard read short (corrupt) is the shard's problem, reported with it; its index
    still describes the records that could be read and the shard's bytes.
    """
    if not shard.dali_index:
        return []
    index_path = layout.join(path.rsplit("/", 1)[0], shard.dali_index)
    try:
        text = storage.read_bytes(index_path)
    except OSError:
        return [f"{index_path}: listed in {INFO} but missing"]
    wrong = f"{index_path}: does not match the records of {path}"
    listed = shard.num_examples
    try:
        table = tfrecord.parse_index(text, listed, storage.size(path), index_path)
    except ValueError as e:
        return [f"{wrong}: {str(e).removeprefix(index_path + ': ')} (rewrite it or convert again)"]
    sizes = [n + tfrecord.FRAME_OVERHEAD for n in lengths]
    if table is not None and list(table[: len(sizes), 1]) != sizes:
        return [f"{wrong} (rewrite it or convert again)"]
    return []


def _key_of(record: bytes) -> bytes | None:
    try:
        return parse_example(record).get(features.KEY)
    except Exception:  # noqa: BLE001 - not an Example: reported by the full check
        return None


def _check_near(path: str, shard: ShardInfo, keys: list[bytes], chars: int) -> list[str]:
    """The fingerprints beside a shard (``--dedupe near``; ``chars``: each one's hex
    digits, :func:`near.sidecar_chars`) name its records in order."""
    if not shard.near:
        return []
    near_path = layout.join(path.rsplit("/", 1)[0], shard.near)
    try:
        lines = near.parse_sidecar(storage.read_bytes(near_path), chars)
    except OSError:
        return [f"{near_path}: listed in {INFO} but missing (evenshard leaks decodes instead)"]
    except ValueError as e:
        return [f"{near_path}: not fingerprint lines: {e}"]
    named = [k.encode("utf-8", "surrogateescape") for k, _ in lines]
    if named != keys:
        return [
            f"{near_path}: {len(lines)} lines, not the {len(keys)} records of {path} in "
            "order (convert again, or remove it: evenshard leaks then decodes the shard)"
        ]
    return []


def _check_strays(out: str, listed: set[str]) -> list[str]:
    names = storage.listdir(out)
    problems = [
        f"{layout.join(out, name)}: stray shard file, not listed in {INFO}"
        for name in names
        if layout.is_shard_name(name) and name not in listed
    ]
    if layout.INCOMPLETE_DIR in names:  # a finished run removes it (a bucket: its objects)
        incomplete = layout.join(out, layout.INCOMPLETE_DIR)
        left = storage.listdir(incomplete)
        problems.append(
            f"{incomplete}: {len(left)} file(s) of a run that did not finish ("
            f"{', '.join(left[:3])}{', ...' if len(left) > 3 else ''}), not part of the "
            "dataset; convert again with --overwrite to clear them"
        )
    return problems


def _check_rejects(out: str, info: DatasetInfo, written: int) -> list[str]:
    problems = []
    rejects = info.rejects
    if info.inputs != written + rejects.total:
        problems.append(
            f"{out}/{INFO}: inputs {info.inputs} != written {written} + rejects {rejects.total}"
        )
    if sum(rejects.by_reason.values()) != rejects.total:
        problems.append(f"{out}/{INFO}: rejects by reason do not sum to the total")
    path = layout.join(out, layout.REJECTS_FILE)
    try:
        lines = storage.read_bytes(path).decode("utf-8").splitlines()
    except OSError:
        return problems + [f"{path}: missing"]
    if len(lines) != rejects.total:
        problems.append(f"{path}: {len(lines)} lines, {INFO} records {rejects.total} rejects")
    return problems
