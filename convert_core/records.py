"""The small values that travel through the pipeline, and reject reasons.

Only metadata moves through the shuffle; image bytes are read once more by
the shard writer and move once, from source to shard. The values are
NamedTuples, not dataclasses: Beam encodes them in about half the bytes and
they take a third of the memory, which is what bounds the local runner.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from schemas.errors import InvalidValueError

# Reject reasons, each with the rule that produces it (also in docs/convert.md).
REJECT_REASONS = {
    "missing": "the file does not exist (or a symlink points nowhere)",
    "empty": "the file has zero bytes",
    "unreadable": (
        "the file exists but cannot be read (permissions, symlink loop, a folder, "
        "a FIFO, device or socket), or a sub-folder of the input cannot be listed"
    ),
    "unsupported_format": "not an image in a supported format (jpeg, png, gif, bmp, webp)",
    "corrupt": "an image header was found but the image does not decode",
    "truncated": "the image data ends early",
    "too_large": "more bytes than --max_image_mb, or more pixels than --max_image_pixels",
    "duplicate_key": "a second input with a key already used; the first (lowest row) is kept",
    "duplicate_file": (
        "a symlink (to a file or a folder) reaching a file already listed, or a manifest "
        "row naming, under another spelling, the file of a row above it"
    ),
    "duplicate_content": "--dedupe content: the same bytes as an input with a smaller key",
    "near_duplicate": (
        "--dedupe near --near_keep one: a near-duplicate (resized, re-encoded, cut a little) "
        "of an image with a smaller key in its cluster, which is kept"
    ),
    "bad_label": "no label, an unusable label, or one outside the --labels vocabulary",
    "bad_path": (
        "a path that escapes its root, holds NUL or is not valid UTF-8, or a bucket URL "
        "without a bucket or an object"
    ),
    "bad_split": (
        "a manifest split value that is not a valid split name, or a --group_by group "
        "whose rows give two different splits (every row of the group)"
    ),
    "changed": (
        "the file's bytes when the shard writer read them were not those inspected "
        "(rewritten or removed while convert ran)"
    ),
    "malformed_row": (
        "a manifest row that cannot be parsed or lacks the path column; each line of a "
        "CSV row over several lines"
    ),
}


class Candidate(NamedTuple):
    """One input as listed, before it is opened.

    Attributes:
        key: stable unique key (path relative to the input root, or the
            manifest's key column).
        source: the image file in compact form (``paths.compact_source``):
            "" for input_root/key, else relative to the input root when under
            it, else its full path or URL.
        rel_path: path relative to ``path_root`` (path kind), else "".
        label: label text.
        split: split given by the manifest, or None.
        group: group value of ``--group_by``, or None.
        row: 1-based manifest row (line for JSONL), 0 for image folders.
    """

    key: str
    source: str
    rel_path: str
    label: str
    split: str | None = None
    group: str | None = None
    row: int = 0


class Image(NamedTuple):
    """An input that passed inspection: what the shard writer needs."""

    key: str
    source: str
    rel_path: str
    label: str
    split: str | None
    group: str | None
    format: str
    height: int
    width: int
    channels: int
    num_bytes: int
    content: str = ""  # sha256 of the file with --dedupe content, else ""
    # CRC-32 of the bytes inspected, which the shard writer compares with the bytes it
    # reads; None when inspection did not read them all (--verify header, over 1 MB)
    crc32: int | None = None
    near: str = ""  # the near-duplicate fingerprint (16 hex digits) with --dedupe near
    # a record of a record input (``source``): its place, by which the shard writer reads
    # it again (TFRecord, WebDataset: byte offset, length; Parquet: row, then byte offset
    # and length in the run's copy); None for an image file
    record: tuple[int, ...] | None = None
    # the image's bytes, carried from inspection to the shard writer instead of read
    # again: a bucket's small images, files or records (``inspect_images.carried``), where a
    # second read is a request for a few KB; None: the writer reads them again
    data: bytes | None = None


class Reject(NamedTuple):
    """An input that is not written, with the reason and a human detail."""

    key: str
    source: str
    reason: str
    detail: str

    def to_json(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True, ensure_ascii=True, allow_nan=False)


def make_reject(key: str, source: str, reason: str, detail: str) -> Reject:
    """A Reject with printable key and source; the reason must be a known one."""
    if reason not in REJECT_REASONS:
        raise InvalidValueError(f"unknown reject reason {reason!r}")
    return Reject(safe_text(key), safe_text(source), reason, detail)


def safe_text(text: str) -> str:
    """Makes text with undecodable file-name bytes printable: b"caf\xe9" -> "caf\\xe9"."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no file name byte explains
        data = text.encode("utf-8", "surrogatepass")
    return data.decode("utf-8", "backslashreplace")
