"""The front door of every reader: ``resolve`` turns what a user asked for into one
typed :class:`Read`, which the faces (tf.data, DALI, PyTorch) only turn into batches.

Here, once: the options merged with the overrides, the checks that need the batch size
and the split, the seed drawn when none was given, a saved state checked against the
read and resumed, and a ``reader.mix`` mixture resolved into its sources and schedule
(a plain split is a read of one source with no schedule).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
import secrets

from reader.front.excluded_keys import warn_unheld
from reader.front.share import Share, random_access
from reader.order.batches import remaining, yielded
from reader.order.mix import Schedule
from reader.values.mixture import Mixture
from reader.values.read_options import ReadOptions
from reader.values.split_shards import check_record_options, split_fingerprint, split_shards
from reader.values.state import ReadState
from schemas.dataset_info import DatasetInfo, load_dataset_info
from schemas.errors import InvalidTypeError, InvalidValueError


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of a read: its dataset_info, folder, split and this worker's share,
    positioned where the read continues."""

    info: DatasetInfo
    data_dir: str
    split: str
    share: Share


@dataclasses.dataclass(frozen=True)
class Read:
    """What one worker reads (see ``resolve``).

    Attributes:
        sources: one, or a mixture's (their shares positioned where the mix continues).
        schedule: which source gives each record of a mixed read; None: one source.
        start: mixed records of this read already behind (the schedule's position).
        remaining: elements yielded from here on (batches, or examples without a batch
            size); None: endless.
        real_batches: with ``pad_final_batch``, batches holding real examples.
        state: the :class:`ReadState` to advance by the batches consumed (None when the
            read was given none).
        seed: the read's seed (None: an unseeded read that draws nothing).
        options: the merged options (a saved start moved into ``state``).
        batch_size: as asked.
        skips: positions (batches from the start, [first, stop)) not yielded: the
            state's skips; ``remaining`` counts them, ``yields`` does not.
    """

    sources: tuple[Source, ...]
    schedule: Schedule | None
    start: int
    remaining: int | None
    real_batches: int
    state: ReadState | None
    seed: int | None
    options: ReadOptions
    batch_size: int | None
    skips: tuple = ()

    @property
    def shuffled(self) -> bool:
        return any(s.share.shuffle for s in self.sources)

    @functools.cached_property
    def excluded(self) -> frozenset:
        """Keys whose rows come as padding rows (the state's ``excluded``; made once: a
        batch's rows are looked up in it)."""
        return frozenset(self.state.excluded or ()) if self.state is not None else frozenset()

    @property
    def yields(self) -> int | None:
        """Elements yielded (None: endless): ``remaining`` less the skipped."""
        return yielded(self.remaining, self.skips)


def merge(options: ReadOptions | None, overrides: dict) -> ReadOptions:
    """``options`` (default ``ReadOptions()``) with the ``overrides`` fields changed; a
    name that is no option is a ``TypeError`` naming it and the closest options."""
    fields = {f.name for f in dataclasses.fields(ReadOptions)}
    for name in overrides:
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), 3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            if name == "view_spread":
                hint = ": views spread batches apart are NumpyReader's and make_dataset's"
            raise InvalidTypeError(f"{name!r} is not a read option{hint}")
    return dataclasses.replace(options or ReadOptions(), **overrides)


def draw_seed() -> int:
    """A fresh seed, for a read given none that needs one (it is in the read's state)."""
    return secrets.randbelow(2**31 - 1)


def start_state(options: ReadOptions, split: str, batch_size: int) -> tuple[ReadState, ReadOptions]:
    """A read given no state, as a state from its start (seeded: a seed drawn once here
    when none was given), and the options without their start: a face that says where
    it stands (``state_dict()``) reads so."""
    seeded = options.shuffles(split) or options.augmenting
    if options.seed is None and seeded and (options.start_step or options.start_epoch):
        raise InvalidValueError(
            "start_step and start_epoch resume a seeded read: pass the seed of the "
            "run being resumed, or its state (state=, load_state_dict)"
        )
    seed = draw_seed() if options.seed is None else options.seed
    state = ReadState(seed, batch_size, epoch=options.start_epoch, step=options.start_step)
    return state, dataclasses.replace(options, start_epoch=0, start_step=0)


def resolve(
    data: str | Mixture,
    split: str,
    batch_size: int | None,
    options: ReadOptions,
    state: ReadState | None = None,
) -> Read:
    """The read of ``data`` (a dataset folder, or a ``reader.mix`` mixture) by this worker.

    Raises:
        DatasetError: the dataset is missing, unfinished, or a listed shard is missing
            or has the wrong size.
        ValueError, TypeError: options that do not fit together; a state that does not
            resume this read.
    """
    read = _resolved(data, split, batch_size, options, state)
    warn_unheld(read)
    return read


def _resolved(data, split, batch_size, options, state) -> Read:
    """``resolve`` but the excluded keys' check."""
    if isinstance(data, Mixture):
        return _mixed(data, batch_size, options, state)
    info = load_dataset_info(data)
    check_record_options(info, options, state, data)
    shards = split_shards(info, data, split)
    shuffle = options.shuffles(split)
    _check(options, batch_size, shuffle)
    if state is not None:
        seed = _check_resumable(options, state, info, split, shards)
    else:
        seed = options.seed
        if seed is None and (shuffle or options.augmenting):
            seed = draw_seed()
    share = Share.of(data, split, shards, batch_size, options, seed, state)
    resumed = None
    if state is not None:
        resumed = _advanced(state, share, seed, batch_size, options, info, split)
    return Read(
        (Source(info, data, split, share),),
        None,
        0,
        share.remaining,
        share.real_batches,
        resumed,
        seed,
        options,
        batch_size,
        _skips(resumed, options),
    )


def _skips(state: ReadState | None, o: ReadOptions) -> tuple:
    """The state's skips as positions of this read; refused where steps do not fit."""
    skips = () if state is None else state.relative_skips()
    if skips and o.pad_final_batch:
        raise InvalidValueError(
            "the state skips steps, and pad_final_batch is for evaluation, which reads "
            "every example: exclude keys instead, or drop the skips"
        )
    return skips


def _advanced(saved: ReadState, share: Share, seed, batch_size, options, info, split):
    """The state of this read, to advance by the batches consumed."""
    segment, unit = share.segment, batch_size or 1
    if segment.consumed % unit:
        raise InvalidValueError(
            f"the state was saved after {segment.consumed} records a worker (batch size "
            f"{saved.batch_size}), not a whole number of batches of {unit}: resume with "
            "a batch size that divides it, or with another worker count"
        )
    return saved.moved(
        segment.consumed // unit,
        seed=seed,
        batch_size=unit,
        epoch=segment.first_epoch,
        num_workers=options.workers()[0],
        dataset=split_fingerprint(info, split),
        order=options.order(split, share.plan.by_place),
        elastic=segment.elastic,
    )


def _mixed(mixture: Mixture, batch_size, o: ReadOptions, state) -> Read:
    """A mixture's read: every source read as it would be alone (a share of single
    records), positioned by the schedule; a saved state resumes it (with any worker
    count for an endless read)."""
    infos = [load_dataset_info(d) for d, _ in mixture.sources]
    _check_sources(mixture, infos)
    if o.start_epoch:
        raise InvalidValueError(
            "a mixed read starts by start_step (mixed batches), not start_epoch"
        )
    unit = batch_size or 1
    n_workers, _ = o.workers()
    order = "weights=" + ",".join(f"{w:g}" for w in mixture.weights)
    asked = state  # its skips, as far ahead of where the mix resumes as they were
    if state is not None and state.parts is None and state.num_workers is None:
        # a new state (``ReadState(seed, batch_size, step=k)``): a new read from step k
        if state.epoch:
            raise InvalidValueError("a mixed read starts by step (mixed batches), not epoch")
        o = dataclasses.replace(
            o, seed=state.seed, start_step=state.step * state.batch_size // unit
        )
        state = None
    if state is None:
        seed = o.seed if o.seed is not None else draw_seed()
        parts = [ReadState(seed, 1) for _ in infos]
        consumed = o.start_step * unit
    else:
        if state.parts is None or len(state.parts) != len(infos):
            raise InvalidValueError("the state was not saved by a mixed read of these sources")
        if o.seed is not None and o.seed != state.seed:
            raise InvalidValueError(
                f"the state was saved with seed {state.seed}, options give {o.seed}"
            )
        if o.start_step:
            raise InvalidValueError("resume takes the start from the state: leave start_step 0")
        if state.order != order:
            raise InvalidValueError(
                f"the state was saved mixing with {state.order}, now {order}: the sources "
                "would be read twice or skipped; mix with the saved weights"
            )
        seed = state.seed
        parts = [ReadState.from_json(p) for p in state.parts]
        consumed = state.step * state.batch_size
        if (state.num_workers or n_workers) != n_workers:  # each source resumes elastically
            if o.epochs is not None:
                raise InvalidValueError(
                    "a finite mixed read resumes with the saved worker count only (its "
                    "schedule depends on each worker's counts); read with epochs=None"
                )
            given = Schedule(mixture.weights, seed, (None,) * len(infos)).counts(consumed)
            parts = [p.advance(int(k)) for p, k in zip(parts, given)]
            consumed = 0
    part_o = dataclasses.replace(
        o, seed=seed, pad_final_batch=False, drop_remainder=False, start_step=0
    )
    reads = [
        resolve(d, split, None, part_o, part) for (d, split), part in zip(mixture.sources, parts)
    ]
    shares = [r.sources[0].share for r in reads]
    schedule = Schedule(mixture.weights, seed, tuple(s.remaining for s in shares))
    given = schedule.counts(consumed)
    left = most = None
    if schedule.size is not None:
        left = schedule.size - consumed
        most = max(sum(s.lefts[w] for s in shares) for w in range(n_workers)) - consumed
    elements, real = remaining(left, most, batch_size, o.pad_final_batch, o.drop_remainder)
    resumed = ReadState(
        seed,
        unit,
        step=consumed // unit,
        num_workers=n_workers,
        order=order,
        parts=tuple(r.state.to_json() for r in reads),
        skips=None if asked is None else asked.moved(consumed // unit).skips,
        excluded=None if asked is None else asked.excluded,
    )
    sources = tuple(
        Source(info, d, split, share.skip(int(k)))
        for info, (d, split), share, k in zip(infos, mixture.sources, shares, given)
    )
    skips = _skips(resumed, o)
    return Read(sources, schedule, consumed, elements, real, resumed, seed, o, batch_size, skips)


def _check_sources(mixture: Mixture, infos: list[DatasetInfo]) -> None:
    """Sources of one mixture share their labels (ids mean the same) and record kind."""
    first = infos[0]
    for (d, split), info in zip(mixture.sources, infos):
        if split not in info.split_names:
            raise InvalidValueError(f"reader.mix: {d} has no split {split!r}")
        if info.labels != first.labels or info.record_kind != first.record_kind:
            raise InvalidValueError(
                f"reader.mix: {d} has other labels or another record kind than "
                f"{mixture.sources[0][0]}: mixed sources share labels.txt (the same label "
                "ids) and the record kind"
            )
        if info.record_kind == "path" and info.path_root != first.path_root:
            raise InvalidValueError("reader.mix: path records of mixed sources share one path_root")


def _check_resumable(
    o: ReadOptions, state: ReadState, info: DatasetInfo, split: str, shards: list[dict]
) -> int:
    """A state resumes only the read it was saved from (the seed, the split's shards and
    the options that shape the order); the start comes from it. Returns the seed."""
    if o.seed is not None and o.seed != state.seed:
        raise InvalidValueError(
            f"the state was saved with seed {state.seed}, options give {o.seed}"
        )
    if o.start_step or o.start_epoch:
        raise InvalidValueError(
            "resume takes the start from the state: leave start_step/start_epoch 0"
        )
    by_place = random_access(shards, o.random_access)
    state.check_same_read(split_fingerprint(info, split), o.order(split, by_place), split)
    return state.seed


def check_state(state) -> None:
    """``state=`` is a ReadState or None: a reader's ``state_dict()`` given there is one
    line saying where it goes."""
    from reader.values.state import ReadState

    if state is not None and not isinstance(state, ReadState):
        hint = (
            "a reader's state_dict() goes to its load_state_dict()"
            if isinstance(state, dict)
            else "ReadState.from_json(text) reads a saved one"
        )
        raise InvalidTypeError(f"state= takes a ReadState, got {type(state).__name__}: {hint}")


def check_sized(o: ReadOptions, batch_size: int | None, read: Read | None = None) -> None:
    """Batches of decoded images need one size (a reader's with a transform do not: only
    what the transform returns is batched; nor do ``read``'s records that are not images)."""
    if read is not None and read.sources[0].info.record_kind == "example":
        return
    if o.decode and batch_size is not None and o.image_size is None:
        raise InvalidValueError(
            "decoded images differ in size: give image_size=(height, width) to "
            "batch them, or batch_size=None, or decode=False"
        )


def _check(o: ReadOptions, batch_size: int | None, shuffle: bool) -> None:
    """Options that only conflict given the batch size and the split's default shuffle."""
    if batch_size is not None and (
        not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool)
    ):
        raise InvalidTypeError(
            f"batch_size must be a whole number (int) or None, got {batch_size!r}"
        )
    if batch_size is not None and batch_size < 1:
        raise InvalidValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    if o.pad_final_batch and (batch_size is None or o.drop_remainder):
        raise InvalidValueError("pad_final_batch needs a batch_size and drop_remainder=False")
    if o.pad_final_batch and (shuffle or o.epochs != 1 or o.start_epoch):
        raise InvalidValueError(
            "pad_final_batch is for evaluation: use shuffle=False, epochs=1 (and start_step, "
            "not start_epoch, to resume)"
        )
    if (o.start_step or o.start_epoch) and (shuffle or o.augmenting) and o.seed is None:
        raise InvalidValueError(
            "start_step and start_epoch resume a seeded read: pass the seed of the run "
            "being resumed (an unseeded shuffle cannot be repeated)"
        )
