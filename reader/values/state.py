"""``ReadState``: the few integers a trainer saves to resume reading where it stopped.

tf.data's own iterator checkpoint saves the shuffle buffer (megabytes to
gigabytes of records); evenshard's read order is computable from
(seed, epoch, position) (``reader.order.plan``), so the state is a handful of
integers, whatever the image or buffer size.
"""

from __future__ import annotations

import dataclasses
import json

from reader.order.batches import after
from reader.values.read_options import MAX_POSITION
from schemas.errors import InvalidTypeError, InvalidValueError


def changes(saved: str, now: str) -> str:
    """What differs between two sets of ``name=value`` pairs: ``name saved -> now``, ..."""
    before = dict(pair.split("=", 1) for pair in saved.split())
    after = dict(pair.split("=", 1) for pair in now.split())
    return ", ".join(
        f"{k} {before.get(k, 'unset')} -> {after.get(k, 'unset')}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    )


@dataclasses.dataclass(frozen=True)
class ReadState:
    """Where a seeded read stands: save it beside a checkpoint, pass it to ``reader.resume``.

    Attributes:
        seed: the read's seed (resuming needs the same one).
        batch_size: examples a batch.
        epoch: the epoch the batch count starts from (0, unless a resume
            with another worker count restarted an epoch).
        step: batches this worker has consumed since then.
        num_workers: workers of the run that saved it (None: not yet read).
        dataset: fingerprint of the split read (its shards' sha256 in
            dataset_info.json): a re-converted or replaced split is refused.
        order: the options that shape the read order, as ``name=value``
            pairs: resuming under others is refused, naming what changed.
        elastic: after a resume with another worker count, the old workers'
            position (workers, epoch, records consumed, and the q and r of
            their own lead) and the offset into what they left, which these
            workers read first (docs/design.md, "Elastic resume"); else None.
        parts: a mixed read (``reader.mix``): each source's own state (JSON) at
            the start of this read; ``step`` then counts mixed batches.
        skips: steps whose batches are not yielded, as [first, stop) ranges after
            ``step`` (``skip``); a read goes on with the batches that follow them.
        excluded: keys left out from here on (``exclude``): their rows come as
            padding rows (``mask`` False, key "", label 0; image zeros from tf.data's
            graph and DALI, a kept row's pixels on the Python route).
    """

    seed: int
    batch_size: int
    epoch: int = 0
    step: int = 0
    num_workers: int | None = None
    dataset: str | None = None
    order: str | None = None
    elastic: tuple[int, ...] | None = None
    parts: tuple[str, ...] | None = None
    skips: tuple[tuple[int, int], ...] | None = None
    excluded: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("seed", "batch_size", "epoch", "step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidTypeError(f"ReadState.{name} must be an int, got {value!r}")
        if self.batch_size < 1 or self.epoch < 0 or self.step < 0:
            raise InvalidValueError(f"ReadState needs batch_size >= 1, epoch, step >= 0: {self}")
        if max(self.epoch, self.step * self.batch_size, self.batch_size) >= MAX_POSITION:
            raise InvalidValueError(
                f"ReadState counts records in int64: epoch, step x batch_size must be below "
                f"2**62, got epoch {self.epoch}, step {self.step}, batch_size {self.batch_size}"
            )
        for name in ("num_workers",):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidValueError(
                    f"ReadState.{name} must be a whole number >= 1, got {value!r}"
                )

        for name in ("dataset", "order"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise InvalidTypeError(f"ReadState.{name} must be a str or None")
        if self.order is not None and not all("=" in pair for pair in self.order.split()):
            raise InvalidValueError(
                f"ReadState.order must be name=value pairs (ReadOptions.order), got {self.order!r}"
            )
        if self.elastic is not None:
            if not isinstance(self.elastic, (list, tuple)):
                raise InvalidTypeError(
                    f"ReadState.elastic must be 6 whole numbers, got {self.elastic!r}"
                )
            elastic = tuple(self.elastic)
            if (
                len(elastic) != 6
                or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_POSITION
                    for v in elastic
                )
                or elastic[0] < 1
            ):
                raise InvalidValueError(
                    "ReadState.elastic must be 6 whole numbers >= 0 (below 2**62), the first "
                    f"(the old worker count) >= 1, got {elastic}"
                )
            object.__setattr__(self, "elastic", elastic)
        if self.parts is not None:
            if not isinstance(self.parts, (list, tuple)):
                raise InvalidTypeError("ReadState.parts must be the sources' states as JSON text")
            parts = tuple(self.parts)
            if not parts or not all(isinstance(p, str) for p in parts):
                raise InvalidTypeError("ReadState.parts must be the sources' states as JSON text")
            object.__setattr__(self, "parts", parts)
        if self.skips is not None:
            self._normalize_skips()
        if self.excluded is not None:
            keys = self.excluded
            if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
                raise InvalidValueError(
                    f"ReadState.excluded must be a list of keys, got {keys!r:.80}"
                )
            object.__setattr__(self, "excluded", tuple(sorted(set(keys))) or None)

    def _normalize_skips(self) -> None:
        """Skips as sorted, merged (first, stop) pairs after ``step``; a step inside one
        moves to its stop (the next batch yielded); none left: None."""
        pairs = self.skips
        if not isinstance(pairs, (list, tuple)) or not all(
            isinstance(p, (list, tuple))
            and len(p) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
            and 0 <= p[0] < p[1] < MAX_POSITION
            for p in pairs
        ):
            raise InvalidValueError(
                f"ReadState.skips must be [first, stop] step pairs, 0 <= first < stop, got "
                f"{pairs!r}"
            )
        merged: list[list[int]] = []
        for first, stop in sorted(tuple(p) for p in pairs):
            if merged and first <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([first, stop])
        step = self.step
        for first, stop in merged:
            if first <= step < stop:
                step = stop
        kept = tuple((a, b) for a, b in merged if b > step)
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "skips", kept or None)

    def skip(self, first: int, stop: int) -> ReadState:
        """This state with the batches of steps ``first`` to ``stop - 1`` left out: a read
        resumed from it yields the batches before them, then those from ``stop`` on
        (steps as this state counts them: its ``step`` is the next batch's)."""
        return dataclasses.replace(self, skips=(*(self.skips or ()), (first, stop)))

    def exclude(self, keys) -> ReadState:
        """This state with ``keys`` left out of every batch read from it on (every face,
        epoch and worker count): their rows come as padding rows, masked."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        return dataclasses.replace(self, excluded=(*(self.excluded or ()), *keys))

    def relative_skips(self) -> tuple[tuple[int, int], ...]:
        """The skips as positions from ``step`` (0: the next batch)."""
        return tuple((a - self.step, b - self.step) for a, b in self.skips or ())

    def moved(self, step: int, **changes) -> ReadState:
        """This state renumbered to ``step`` (a resume that counts anew), its skips as far
        ahead of it as they were."""
        skips = tuple((step + a, step + b) for a, b in self.relative_skips()) or None
        return dataclasses.replace(self, step=step, skips=skips, **changes)

    def advance(self, steps: int) -> ReadState:
        """The state after ``steps`` more batches yielded (the skips passed over)."""
        return dataclasses.replace(self, step=self.step + after(steps, self.relative_skips()))

    def check_same_read(self, dataset: str, order: str, split: str) -> None:
        """Raises ValueError unless this state was saved reading ``split`` with this
        fingerprint and these order options (or does not know them: a new state).

        A state resumes only the read it was saved from: the same split's shards, and
        the options that shape the order; otherwise examples would be read twice or
        never.
        """
        if self.dataset not in (None, dataset):
            raise InvalidValueError(
                f"the state was saved reading another version of split {split!r} (its "
                "shards' checksums differ from those in dataset_info.json: re-converted "
                "or replaced); resuming would read some examples twice and others never: "
                "start a new read"
            )
        if self.order in (None, order):
            return
        if "random_access=" in order and "random_access=" not in self.order:
            raise InvalidValueError(
                "the state was saved reading the shards in runs and windows (every state "
                "before random access, a bucket's read, and any read with "
                "random_access=False); this read fetches records by place, in another "
                "order: pass random_access=False (--no_random_access) to resume it"
            )
        if "random_access=" in self.order and "random_access=" not in order:
            raise InvalidValueError(
                "the state was saved reading local shards by place (one permutation an "
                "epoch); this read is in runs and windows (a bucket's shards, gzip, or "
                "random_access=False), in another order: resume it from a local, "
                "uncompressed copy with random_access left at None"
            )
        raise InvalidValueError(
            f"the state was saved reading with other order options ({changes(self.order, order)}"
            "): the order would differ and some examples would be read twice, others never; "
            "pass the options of the saved run, or start a new read"
        )

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        for name in ("skips", "excluded"):  # as states were saved before them
            if fields[name] is None:
                del fields[name]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadState:
        try:
            fields = json.loads(text)
        except (TypeError, ValueError) as e:
            raise InvalidValueError(f"not a ReadState: not JSON text ({e})") from None
        if not isinstance(fields, dict):
            raise InvalidValueError(
                f"not a ReadState: a JSON object was expected, got {text!r:.80}"
            )
        # saved before the split's fingerprint replaced it: what it checked, that does
        fields.pop("examples_per_worker", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - known
        if unknown:
            raise InvalidValueError(f"not a ReadState: unknown fields {sorted(unknown)}")
        missing = {"seed", "batch_size"} - set(fields)
        if missing:
            raise InvalidValueError(f"not a ReadState: no {' and no '.join(sorted(missing))}")
        return cls(**fields)
