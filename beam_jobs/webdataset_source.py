"""WebDataset tars as inputs (issue 42): a sample is the members of a tar that share a
key (WebDataset's rule: ``dir/name.EXT`` is sample ``dir/name``, member ``EXT``,
the basename cut at its first dot), in a row.

Each tar (``.tar``, or gzip: ``.tar.gz``, ``.tgz``) is read once, as a stream. A
sample's members become features as a TFRecord's are (``_features``): each member
its bytes under its extension (a sample's only image member, whatever its
extension, also as ``image``), ``cls`` an int64 (text when it is no integer), ``json`` its
top-level ints and texts as ``json.NAME``, ``__key__`` the sample's key; so the same rules
choose and read them (``record_rules``). A record's place is its image member's
(byte offset in the tar, length): the writer reads it again with one ranged read
(gzip: the tar decompressed up to it, once a file a shard). Damage (a tar cut
short, between members too, a damaged member header, a file that is no tar) is
one reject naming the sample and its byte; the samples before it are kept.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import tarfile
import zlib

from beam_jobs.record_source import ReadRecordFile, as_inspected
from convert_core import paths
from convert_core.record_rules import RecordFormat, RecordProblem
from convert_core.records import Image, make_reject
from schemas import storage
from schemas.errors import Error, InvalidValueError
from schemas.images import IMAGE_EXTENSIONS


def _split(name: str) -> tuple[str, str]:
    """A member's (sample key, extension): ``a/b.c.d`` -> (``a/b``, ``c.d``)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


class _HeaderDamage(Error, tarfile.ReadError):
    """A member header past the first that is damaged, or the file's end before one."""


class _TarInfo(tarfile.TarInfo):
    """A member header that says where it is damaged: tarfile's stream ends quietly at a
    bad checksum or at a header the file ends in or before (a copy cut at a 512-byte
    boundary), which would drop the samples after it unseen; here each raises
    _HeaderDamage (the end-of-archive zero block still ends the stream)."""

    @classmethod
    def fromtarfile(cls, tar):
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as e:
            if tar.offset == 0 or isinstance(e, tarfile.EOFHeaderError):
                raise  # the first header: tarfile's "no tar"; the end-of-archive block
            if isinstance(e, tarfile.EmptyHeaderError):
                problem = "unexpected end of data: no end-of-archive block"
            elif isinstance(e, tarfile.TruncatedHeaderError):
                problem = "unexpected end of data inside a header"
            else:
                problem = f"a member's header is damaged ({e})"
            raise _HeaderDamage(problem) from None


def _samples(raw):
    """A tar stream's samples, in order: (key, {ext: (data offset, bytes)}). Raises
    tarfile.ReadError or EOFError where the tar is damaged."""
    key, members = None, {}
    with tarfile.open(fileobj=raw, mode="r|*", tarinfo=_TarInfo) as tar:
        try:
            for m in tar:
                if not m.isfile():
                    continue
                k, ext = _split(m.name)
                if k != key and members:
                    yield key, members
                    members = {}
                key = k
                members[ext] = (m.offset_data, tar.extractfile(m).read())
        except _HeaderDamage:
            if members:  # its members read whole: the damage is at the next header
                yield key, members
            raise
    if members:
        yield key, members


def _images(members: dict) -> list[str]:
    """The extensions of a sample's image members (``jpg``, ``left.png``)."""
    return [e for e in members if "." + e.rpartition(".")[2] in IMAGE_EXTENSIONS]


def _not_one_image(key: str, members: dict) -> str | None:
    """Why a sample has no feature ``image`` (none, or several image members, each
    its extension's), naming its members and the flag that picks one; None when it has
    one."""
    images = sorted(_images(members))
    if "image" in members or len(images) == 1:
        return None
    if not images:
        names = ", ".join(f"{key}.{e}" for e in sorted(members))
        return f"no image member (its members: {names})"
    names = ", ".join(f"{key}.{e}" for e in images)
    flags = " or ".join(f"--image_feature={e}" for e in images)
    return (
        f"{len(images)} image members ({names}) where one image is expected: pick one with {flags}"
    )


def _member(members: dict, feature: str) -> tuple[int, bytes] | None:
    """The (data offset, bytes) of feature ``feature``'s member: ``image``, a sample's
    only image member; else the member of that extension."""
    images = _images(members)
    if feature == "image" and len(images) == 1 and "image" not in members:
        return members[images[0]]
    return members.get(feature)


def _int(text: str) -> int | None:
    """``text`` as an int when it is one in ASCII digits (``-3``; not ``--3``, ``²``,
    nor past int's 4,300 digits), else None."""
    if not re.fullmatch(r"-?[0-9]+", text):
        return None
    try:
        return int(text)
    except ValueError:  # past sys.get_int_max_str_digits()
        return None


def _features(key: str, members: dict) -> dict[str, tuple[str, list]]:
    found: dict[str, tuple[str, list]] = {"__key__": ("bytes", [key.encode("utf-8")])}
    images = _images(members)
    for ext, (_, data) in members.items():
        found[ext] = ("bytes", [data])
        if len(images) == 1 and ext == images[0] and "image" not in members:
            found["image"] = found[ext]  # the same value: an alias, chosen over its extension
        if ext == "cls":
            text = data.decode("utf-8", "replace").strip()
            number = _int(text)
            found[ext] = ("int64", [number]) if number is not None else ("bytes", [text.encode()])
        elif ext == "json":
            try:
                fields = json.loads(data)
            except (ValueError, RecursionError):  # no JSON, or nested past Python's stack
                continue
            for name, v in fields.items() if isinstance(fields, dict) else ():
                if isinstance(v, int) and not isinstance(v, bool):
                    found[f"json.{name}"] = ("int64", [v])
                elif isinstance(v, str):
                    found[f"json.{name}"] = ("bytes", [v.encode("utf-8")])
    return found


class _ReadTar(ReadRecordFile):
    """tar path -> Image | Reject, one a sample, and one Reject for damage."""

    def _features(self, key: str, members: dict) -> dict[str, tuple[str, list]]:
        """A sample's features; a ``missing`` RecordProblem naming its image members when
        the image chosen is ``image`` and the sample has no one image."""
        problem = _not_one_image(key, members) if self._image == "image" else None
        if problem:
            raise RecordProblem("missing", problem)
        return _features(key, members)

    def process(self, path: str):
        rel = paths.relative_to(self._root, path) or path
        index, byte = 0, 0  # the next sample, and where its first member starts
        try:
            with storage.open_binary(path) as raw:
                for key, members in _samples(raw):
                    first = min(o for o, _ in members.values())
                    place = _member(members, self._image) or (first, b"")
                    where = f"sample {index} ({key!r}, byte {place[0]})"
                    features = functools.partial(self._features, key, members)
                    yield self.record(
                        path, f"{rel}#{index}", where, features, (place[0], len(place[1]))
                    )
                    index += 1
                    byte = max(o + len(d) for o, d in members.values())
        except (tarfile.ReadError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            reason = "truncated" if "unexpected end" in str(e) else "corrupt"
            problem = (
                "the tar ends inside it"
                if reason == "truncated"
                else str(e)
                if isinstance(e, _HeaderDamage)
                else f"no tar ({e})"
            )
            detail = (
                f"sample {index} (after byte {byte}): {problem}; the samples before it are kept"
            )
            yield make_reject(f"{rel}#{index}", path, reason, detail)
        except OSError as e:  # BeamIOError is one
            yield self.unreadable(f"{rel}#{index}", path, f"sample {index}", e)


def _first(path: str) -> dict | None:
    try:
        with storage.open_binary(path) as raw:
            for key, members in _samples(raw):
                return _features(key, members)
    except (tarfile.ReadError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InvalidValueError(f"{path}: sample 0: not a readable tar ({e})") from None
    return None


def images_again(items: list[tuple[str, Image]], feature: str, scratch: str | None = None):
    """The images of a shard's samples (``items``: (tar, Image), ``im.record``: the image
    member's (byte offset, length)) read again, in order: (bytes, what changed since
    inspection or None) each. A plain tar: one ranged read an image; gzip: each tar
    decompressed once, up to the last image the shard needs of it."""
    wanted: dict[str, set[tuple[int, int]]] = {}
    for path, im in items:
        if _gzipped(path):
            wanted.setdefault(path, set()).add(im.record)
    found = {path: _gzip_ranges(path, ranges) for path, ranges in wanted.items()}
    for path, im in items:
        offset, length = im.record
        try:
            data = found[path][offset, length] if path in found else None
            if isinstance(data, Exception):
                raise data
            if data is None:
                data = storage.read_range(path, length, offset)
        except FileNotFoundError:
            yield b"", "the file was removed after it was inspected"
            continue
        except (OSError, EOFError, zlib.error) as e:
            yield b"", f"byte {offset}: the member is not the one inspected ({e})"
            continue
        yield as_inspected(data, im, f"byte {offset}", "the member's image")


def _gzipped(path: str) -> bool:
    return path.lower().endswith((".tar.gz", ".tgz"))


def _gzip_ranges(path: str, ranges: set[tuple[int, int]]) -> dict:
    """The (offset, length) ranges of a gzip tar's decompressed stream, or the error."""
    got: dict = {}
    try:
        with storage.open_binary(path) as raw, gzip.GzipFile(fileobj=raw) as stream:
            at = 0
            for offset, length in sorted(ranges):
                while at < offset:  # skipped a megabyte at a time
                    skipped = len(stream.read(min(offset - at, 1 << 20)))
                    if not skipped:
                        raise EOFError(f"the file ends before byte {offset}")
                    at += skipped
                got[offset, length] = stream.read(length)
                at = offset + len(got[offset, length])
    except (OSError, EOFError, zlib.error) as e:
        got = dict.fromkeys(ranges, e)
    return got


FORMAT = RecordFormat(
    "webdataset", "WebDataset", _ReadTar, _first, images_again, label_names=("cls",)
)
