"""Options of ``evenshard convert``: parsing, and checks that fail fast.

Every check here runs in the driver before any pipeline work starts, so a
user mistake (wrong flag value, missing input, fractions that do not sum to
one, a finished dataset in the way) stops the job at once with one line that
says what to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from schemas.errors import Error
from schemas.features import RECORD_KINDS
from schemas.layout import COMPRESSIONS, MAX_SHARDS, MAX_SPLIT_NAME, SPLIT_NAME_RE
from schemas.near import DEFAULT_DISTANCE, MAX_DISTANCE
from schemas.near_embedding import DEFAULT_THRESHOLD

SPLIT_MODES = ("hash", "exact")
BALANCES = ("none", "label")
VERIFY_MODES = ("full", "header")
DEDUPE_MODES = ("none", "content", "near")
NEAR_KEEP = ("all", "one")
MANIFEST_SUFFIXES = (".csv", ".jsonl", ".csv.gz", ".jsonl.gz")


@dataclasses.dataclass(frozen=True)
class RecordInput:
    """A row of the registry of record formats (``RECORD_FORMATS``)."""

    module: str  # the module whose FORMAT (a record_rules.RecordFormat) reads the files
    names: tuple[str, ...]  # a folder's files of it: patterns of the name, any case
    examples: bool = False  # its records are tf.train.Examples: --record_kind example
    split_files: str | None = None  # one --input_split's files ({root}, {split}; "*" all)
    # files a folder of it holds beside its records, which tell it from a format of the
    # same names (a TFDS version folder's JSON beside its TFRecord files)
    beside: tuple[str, ...] = ()


# --input_format for records -> its row: the one registry of record formats
# (beam_jobs.record_formats imports each module; nothing else names a format)
RECORD_FORMATS = {
    "tfrecord": RecordInput("beam_jobs.tfrecord_source", ("*.tfrecord*",), examples=True),
    "parquet": RecordInput("beam_jobs.parquet_source", ("*.parquet",)),
    "webdataset": RecordInput("beam_jobs.webdataset_source", ("*.tar", "*.tar.gz", "*.tgz")),
    "tfds": RecordInput(
        "beam_jobs.tfds_source",
        ("*.tfrecord*",),
        examples=True,
        split_files="{root}/*-{split}.tfrecord-*-of-*",
        beside=("dataset_info.json", "features.json"),
    ),
}
INPUT_FORMATS = ("images", *RECORD_FORMATS)
# --record_kind example: each tf.train.Example of a record input written as it is
EXAMPLE_KIND = "example"
EXAMPLE_INPUTS = tuple(name for name, row in RECORD_FORMATS.items() if row.examples)
TARGET_SHARD_MB = 128.0  # --target_shard_mb's default


class UserError(Error, ValueError):
    """A mistake in the command line or the inputs, reported as one line."""


class DatasetRefused(Error, RuntimeError):
    """The run ended without a dataset because of its inputs (more rejects than
    --max_reject_fraction allows, inputs rewritten while it ran): one line saying
    why and what to do.

    Never raised in a worker: finalize writes the line to ``REFUSED_FILE``
    (``refuse``) and the pipeline ends normally; the driver raises this as its
    claim on the output folder ends (``output.claim``: a worker's exception
    reached the user wrapped, with a traceback a worker).
    """


def parse_splits(text: str) -> tuple[tuple[str, float], ...]:
    """Parses ``train=0.8,val=0.1,test=0.1`` into ordered (name, fraction) pairs.

    Raises:
        UserError: names that cannot be file names, repeated names, fractions
            outside (0, 1] or fractions that do not sum to 1.
    """
    pairs: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, frac_text = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserError(
                f"--splits: expected NAME=FRACTION pairs like train=0.8,val=0.2, got {part!r}"
            )
        if not SPLIT_NAME_RE.match(name):
            raise UserError(
                f"--splits: split name {name!r} may only use letters, digits and '_', at "
                f"most {MAX_SPLIT_NAME} of them (it becomes part of the shard file names)"
            )
        try:
            frac = float(frac_text)
        except ValueError:
            raise UserError(
                f"--splits: fraction of {name!r} is not a number: {frac_text!r}"
            ) from None
        if not (0.0 < frac <= 1.0) or math.isnan(frac):
            raise UserError(f"--splits: fraction of {name!r} must be in (0, 1], got {frac_text}")
        if name in dict(pairs):
            raise UserError(f"--splits: split {name!r} is given twice")
        pairs.append((name, frac))
    total = sum(f for _, f in pairs)
    if abs(total - 1.0) > 1e-6:
        raise UserError(
            f"--splits: fractions must sum to 1, they sum to {total:g} ({text}); "
            "adjust them, e.g. train=0.8,val=0.1,test=0.1"
        )
    return tuple(pairs)


def format_splits(splits: tuple[tuple[str, float], ...]) -> str:
    """The ``--splits`` text of parsed splits: ``train=0.8,val=0.1,test=0.1``."""
    return ",".join(f"{name}={fraction:g}" for name, fraction in splits)


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Validated options of one conversion. See ``evenshard convert --help``."""

    input: str
    output_dir: str
    input_format: str = "images"
    image_feature: str | None = None
    label_feature: str | None = None
    key_feature: str | None = None
    input_split: str | None = None
    record_kind: str = "image"
    splits: tuple[tuple[str, float], ...] = (("train", 0.8), ("val", 0.1), ("test", 0.1))
    split_mode: str = "hash"
    split_seed: int = 0
    group_by: str | None = None
    balance: str = "none"
    seed: int = 0
    target_shard_mb: float = TARGET_SHARD_MB
    num_shards: int | None = None
    examples_per_shard: int | None = None
    shard_multiple: int = 1
    compression: str = "none"
    max_reject_fraction: float = 0.01
    path_root: str | None = None
    max_image_pixels: int = 178_956_970  # Pillow's own bomb limit, 2x its warning level
    max_image_mb: float = 256.0  # larger files are too_large before a byte is read
    verify: str = "full"
    dedupe: str = "none"
    near_distance: int = DEFAULT_DISTANCE
    near_keep: str = "all"
    near_embedding: str | None = None
    near_threshold: float = DEFAULT_THRESHOLD
    overwrite: bool = False
    labels_file: str | None = None

    def __post_init__(self) -> None:
        def choice(flag: str, value: str, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                raise UserError(f"--{flag}: expected one of {', '.join(allowed)}, got {value!r}")

        choice("input_format", self.input_format, INPUT_FORMATS)
        choice("record_kind", self.record_kind, (*RECORD_KINDS, EXAMPLE_KIND))
        choice("split_mode", self.split_mode, SPLIT_MODES)
        choice("balance", self.balance, BALANCES)
        choice("compression", self.compression, COMPRESSIONS)
        choice("verify", self.verify, VERIFY_MODES)
        choice("dedupe", self.dedupe, DEDUPE_MODES)
        choice("near_keep", self.near_keep, NEAR_KEEP)
        if not self.input:
            raise UserError("--input is required: an image folder or a .csv/.jsonl manifest")
        if not self.output_dir:
            raise UserError("--output_dir is required")
        if not (self.target_shard_mb > 0):
            raise UserError(f"--target_shard_mb must be > 0, got {self.target_shard_mb}")
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_SHARDS:
            raise UserError(
                f"--num_shards must be in [1, {MAX_SHARDS}] (shard names number them in five "
                f"digits), got {self.num_shards}"
            )
        self._check_examples_per_shard()
        if not 1 <= self.shard_multiple <= MAX_SHARDS:
            raise UserError(
                f"--shard_multiple must be in [1, {MAX_SHARDS}], got {self.shard_multiple}"
            )
        if not (0.0 <= self.max_reject_fraction <= 1.0):
            raise UserError(
                f"--max_reject_fraction must be in [0, 1], got {self.max_reject_fraction}"
            )
        if not (self.max_image_mb > 0):
            raise UserError(f"--max_image_mb must be > 0, got {self.max_image_mb}")
        if self.max_image_pixels < 1:
            raise UserError(f"--max_image_pixels must be >= 1, got {self.max_image_pixels}")
        if self.input_format != "images" and self.record_kind == "path":
            raise UserError(
                "--record_kind=path stores image paths, and records hold no image files: "
                f"drop --record_kind with --input_format={self.input_format}"
            )
        splits = [name for name, row in RECORD_FORMATS.items() if row.split_files]
        if self.input_split is not None and self.input_format not in splits:
            raise UserError(
                "--input_split names a split of a TFDS dataset: add "
                f"--input_format={' or '.join(splits)}"
            )
        features = (self.image_feature, self.label_feature, self.key_feature)
        if self.input_format == "images" and any(features):
            raise UserError(
                "--image_feature, --label_feature and --key_feature name features of "
                "records: add --input_format=tfrecord (or parquet, webdataset, tfds)"
            )
        if self.path_root is not None and self.record_kind != "path":
            raise UserError("--path_root only applies to --record_kind=path")
        if self.record_kind == EXAMPLE_KIND:
            self._check_example_kind()
        if self.group_by is not None:
            if self.input_format == "images" and not self.is_manifest:
                raise UserError(
                    "--group_by needs a .csv/.jsonl manifest (a column) or a record input "
                    "(a feature) as --input"
                )
            if self.split_mode != "hash":
                raise UserError(
                    "--group_by works with --split_mode=hash only (exact stratified "
                    "counts cannot also keep groups whole)"
                )
        if not 0 <= self.near_distance <= MAX_DISTANCE:
            raise UserError(
                f"--near_distance must be in [0, {MAX_DISTANCE}] bits of the 64-bit "
                f"fingerprint, got {self.near_distance}"
            )
        if self.dedupe != "near" and (
            self.near_distance != DEFAULT_DISTANCE or self.near_keep != "all"
        ):
            raise UserError("--near_distance and --near_keep apply to --dedupe near only")
        self._check_embedding()
        if self.dedupe == "near" and self.near_keep == "all" and self.split_mode != "hash":
            raise UserError(
                "--dedupe near keeps each cluster of near-duplicates in one split, which "
                "--split_mode=exact cannot also do: use --split_mode=hash, or "
                "--near_keep one (one image a cluster, the others rejected)"
            )
        if self.num_shards is not None and self.num_shards % self.shard_multiple:
            raise UserError(
                f"--num_shards={self.num_shards} is not a multiple of "
                f"--shard_multiple={self.shard_multiple}"
            )

    def _check_embedding(self) -> None:
        """--near_embedding: with --dedupe near, a function the launcher can import (the
        workers import it again); --near_threshold: a cosine, with an embedding only."""
        if self.near_embedding is None:
            if self.near_threshold != DEFAULT_THRESHOLD:
                raise UserError(
                    "--near_threshold applies to --near_embedding only (the perceptual hash "
                    "takes --near_distance): add --near_embedding MODULE:FUNCTION, or drop it"
                )
            return
        if self.dedupe != "near":
            raise UserError(
                "--near_embedding applies to --dedupe near only: add --dedupe near, or drop "
                "--near_embedding"
            )
        if not 0.0 < self.near_threshold <= 1.0 or math.isnan(self.near_threshold):
            raise UserError(
                f"--near_threshold must be a cosine similarity in (0, 1], got "
                f"{self.near_threshold} (e.g. 0.95: near-identical; 0.9: looser)"
            )
        if self.near_distance != DEFAULT_DISTANCE:
            raise UserError(
                "--near_distance applies to the perceptual hash, not to --near_embedding: "
                "set how close images must be with --near_threshold"
            )
        from schemas.errors import InvalidValueError
        from schemas.near_embedding import load

        try:
            load(self.near_embedding)
        except InvalidValueError as e:
            raise UserError(str(e)) from None

    def _check_examples_per_shard(self) -> None:
        """--examples_per_shard: a count of at least 1, and the one way the shard count
        is set (a --target_shard_mb other than its default counts as given)."""
        n = self.examples_per_shard
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(
                f"--examples_per_shard must be a whole number >= 1 (examples a shard), got {n}"
            )
        for flag, given in (
            ("--num_shards", self.num_shards is not None),
            ("--target_shard_mb", self.target_shard_mb != TARGET_SHARD_MB),
        ):
            if given:
                raise UserError(
                    f"--examples_per_shard and {flag} both set the shard count: give one of them"
                )

    def _check_example_kind(self) -> None:
        """--record_kind example: tf.train.Example records, nothing about an image."""
        if self.input_format not in EXAMPLE_INPUTS:
            raise UserError(
                "--record_kind=example writes each tf.train.Example of the input as it is: "
                f"give --input_format={' or '.join(EXAMPLE_INPUTS)}, whose records are "
                f"Examples (not {self.input_format})"
            )
        if self.image_feature is not None:
            raise UserError(
                "--image_feature names the image of --record_kind=image; --record_kind=example "
                "checks no image: drop one of them"
            )
        if self.balance == "label" and self.label_feature is None:
            raise UserError("--balance=label with --record_kind=example needs --label_feature")
        if self.dedupe == "near":
            raise UserError(
                "--dedupe near compares images; --record_kind=example has none: "
                "use --dedupe content (identical records) or none"
            )

    @property
    def is_manifest(self) -> bool:
        return self.input_format == "images" and self.input.lower().endswith(MANIFEST_SUFFIXES)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    @property
    def split_fractions(self) -> tuple[float, ...]:
        return tuple(fraction for _, fraction in self.splits)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UserErrors (one line, no usage dump)."""

    def error(self, message: str):  # noqa: D102 - argparse API
        raise UserError(message)


DESCRIPTION = (
    "Convert an image folder or a CSV/JSONL manifest into globally shuffled, "
    "split, balanced TFRecord shards. Flags not listed here (--runner, "
    "--direct_num_workers, Dataflow flags, ...) go to Beam's PipelineOptions."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of convert's own flags; no abbreviations (``--out`` is not ``--output_dir``)."""
    p = _Parser(
        prog="evenshard convert",
        description=DESCRIPTION,
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_flags(p)
    return p


# Convert's flags: the field of ConvertOptions each sets -> (its help, its choices).
# Types and defaults are the fields' own; ``--labels`` sets ``labels_file``.
_FLAGS = {
    "input": (
        "image-folder root, or a .csv/.jsonl manifest (local, gs://, s3://); with "
        "--input_format=tfrecord a folder of *.tfrecord* files, or a glob of them "
        "(parquet: *.parquet; webdataset: *.tar, *.tar.gz, *.tgz; tfds: a prepared "
        "dataset's version folder, NAME/VERSION)",
        None,
    ),
    "output_dir": ("where shards and dataset_info.json go", None),
    "input_format": (
        "images: image files; tfrecord: tf.train.Example records; parquet: rows as "
        "Hugging Face datasets writes them; webdataset: samples of tars; tfds: a "
        "TFDS-prepared dataset",
        INPUT_FORMATS,
    ),
    "image_feature": ("records: the feature (column) holding the image (found if one fits)", None),
    "label_feature": (
        "records: the int or text label feature (found if one fits; --record_kind=example: "
        "only when named)",
        None,
    ),
    "key_feature": ("records: a text feature of unique keys (default FILE#INDEX)", None),
    "input_split": ("tfds: the one split of the dataset read (default: all)", None),
    "record_kind": (
        "image: bytes in the record; path: the path only; example: a tfrecord or tfds "
        "input's tf.train.Examples as they are (no image)",
        (*RECORD_KINDS, EXAMPLE_KIND),
    ),
    "splits": ("NAME=FRACTION,... summing to 1", None),
    "split_mode": ("hash: stable as data grows; exact: stratified counts", SPLIT_MODES),
    "split_seed": ("salt of the split assignment (not --seed)", None),
    "group_by": (
        "manifest column or record feature: a group never spans two splits",
        None,
    ),
    "balance": ("label: the same label mix in every shard", BALANCES),
    "seed": ("seed of the global shuffle", None),
    "target_shard_mb": ("target shard size in MB", None),
    "num_shards": ("shards per split (overrides the size target)", None),
    "examples_per_shard": (
        "about this many examples a shard: ceil(examples / N) shards a split (not with "
        "--num_shards or --target_shard_mb)",
        None,
    ),
    "shard_multiple": ("round shard counts up to a multiple of K", None),
    "compression": ("gzip writes .tfrecord.gz", COMPRESSIONS),
    "max_reject_fraction": ("fail above this reject fraction", None),
    "path_root": ("path kind: paths are stored relative to this root", None),
    "max_image_pixels": ("reject images with more pixels (decompression-bomb guard)", None),
    "max_image_mb": ("reject larger files (too_large) before reading them", None),
    "verify": ("full: decode every image; header: format and size only", VERIFY_MODES),
    "dedupe": (
        "content: byte-identical images under other names are rejected "
        "(duplicate_content), so no copy lands in two splits; near: near-duplicates "
        "(resized, re-encoded, cut a little) are clustered and a cluster never spans "
        "two splits",
        DEDUPE_MODES,
    ),
    "near_distance": (
        "--dedupe near: images whose 64-bit fingerprints differ in at most this many "
        "bits are near-duplicates",
        None,
    ),
    "near_keep": (
        "--dedupe near: all: every image, a cluster in one split; one: the smallest "
        "key of a cluster, the others rejected (near_duplicate)",
        NEAR_KEEP,
    ),
    "near_embedding": (
        "--dedupe near: MODULE:FUNCTION, the user's embedding (an RGB uint8 H x W x 3 array "
        "-> a 1-D float vector; with FUNCTION.batched = True, a list of them -> one row "
        "each), imported in the workers: images whose vectors' cosine is at least "
        "--near_threshold are near-duplicates (instead of the perceptual hash)",
        None,
    ),
    "near_threshold": ("--near_embedding: the cosine similarity, in (0, 1]", None),
    "overwrite": ("replace a finished dataset in --output_dir", None),
    "labels_file": (
        "file with one label a line: a fixed vocabulary; other labels are rejects",
        None,
    ),
}
_TYPES = {"int": int, "float": float, "int | None": int}


def add_flags(p: argparse.ArgumentParser) -> None:
    """Adds convert's flags to a parser (this one, or the CLI's subcommand), each with
    the type and default of its ``ConvertOptions`` field."""
    for field in dataclasses.fields(ConvertOptions):
        text, choices = _FLAGS[field.name]
        flag = "--labels" if field.name == "labels_file" else f"--{field.name}"
        if field.default is dataclasses.MISSING:  # input, output_dir
            p.add_argument(flag, required=True, help=text)
        elif field.type == "bool":
            p.add_argument(flag, action="store_true", help=text)
        else:
            default = format_splits(field.default) if field.name == "splits" else field.default
            p.add_argument(
                flag,
                dest=field.name,
                type=_TYPES.get(field.type),
                default=default,
                choices=choices,
                help=text,
            )


def from_namespace(args: argparse.Namespace) -> ConvertOptions:
    """The validated options of parsed flags (other attributes are ignored)."""
    fields = {f.name for f in dataclasses.fields(ConvertOptions)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    values["splits"] = parse_splits(values["splits"])
    return ConvertOptions(**values)


def parse_args(argv: list[str] | None) -> tuple[ConvertOptions, list[str]]:
    """Splits argv into validated job options and the rest (for PipelineOptions)."""
    known, rest = build_parser().parse_known_args(argv)
    return from_namespace(known), rest


def is_csv(path: str) -> bool:
    """The manifest format, by suffix: ``.csv``/``.csv.gz`` (else ``.jsonl``/``.jsonl.gz``)."""
    return path.lower().removesuffix(".gz").endswith(".csv")
