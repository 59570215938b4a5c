"""``--record_kind example`` (issue 42): a record input's tf.train.Examples written as they
are, shuffled, split and balanced as images are.

No image is looked for or checked: a record's facts are its bytes' (their number, their
CRC-32, by which the shard writer knows the record it reads again is the one read
first, and their sha256 with ``--dedupe content``), and the features convert uses are
those the flags name: the label (``--label_feature``; none: no label), the key
(``--key_feature``; none: ``FILE#INDEX``) and the group (``--group_by``). The writer
copies each record's bytes unchanged and counts its features (``schemas.inferred``),
from which finalize writes the schema. Plain Python: no Beam.
"""

from __future__ import annotations

import hashlib
import zlib

from convert_core.options import UserError
from convert_core.record_rules import RecordFeatures


def record_facts(data: bytes, hash_content: bool) -> tuple:
    """What ``InspectImage.image`` takes of a record written as it is: no format, no
    pixels; its size, its sha256 with ``--dedupe content``, its CRC-32."""
    content = hashlib.sha256(data).hexdigest() if hash_content else ""
    return "", 0, 0, 0, "", len(data), content, zlib.crc32(data)


def choose_example_features(
    found: dict[str, tuple[str, list]], label: str | None, key: str | None, group: str | None
) -> RecordFeatures:
    """The features the flags name, each checked in the first record (``found``:
    ``parse_features``): nothing is chosen unasked, since every feature is data here.

    Raises:
        UserError: a named feature the first record lacks, or of a kind it cannot be.
    """
    names = ", ".join(sorted(found)) or "none"

    def named(flag: str, name: str, kinds: tuple[str, ...]) -> str:
        kind, values = found.get(name, ("", []))
        if kind not in kinds or len(values) != 1:
            what = f" ({name!r} is {_described(kind, values)})" if name in found else ""
            raise UserError(
                f"--{flag}: the first record has no {' or '.join(kinds)} feature {name!r} "
                f"of one value{what}; its features: {names}"
            )
        return kind

    label_kind = named("label_feature", label, ("int64", "bytes")) if label else ""
    if key:
        named("key_feature", key, ("bytes",))
    if group:
        named("group_by", group, ("int64", "bytes"))
    return RecordFeatures(None, label, label_kind, key, group)


def _described(kind: str, values: list) -> str:
    """A feature's kind and length, as an error names them: 'a float list of 1 value'."""
    if not kind:
        return "a feature with no list"
    n = len(values)
    return f"{'an' if kind == 'int64' else 'a'} {kind} list of {n} value{'' if n == 1 else 's'}"
