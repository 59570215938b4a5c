"""``ReadState``: the few integers a trainer saves to resume reading where it stopped.

tf.data's own iterator checkpoint saves the shuffle buffer (megabytes to
gigabytes of records); evenshard's read order is computable from
(seed, epoch, position) (``reader.plan``), so the state is a handful of
integers, whatever the image or buffer size.
"""

from __future__ import annotations

import dataclasses
import json
import logging

log = logging.getLogger(__name__)


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
        examples_per_worker: examples a worker reads per epoch in that run;
            a different figure at resume means the split changed.
        dataset: fingerprint of the split read (its shards' sha256 in
            dataset_info.json): a re-converted or replaced split is refused.
        order: the options that shape the read order, as ``name=value``
            pairs: resuming under others is refused, naming what changed.
    """

    seed: int
    batch_size: int
    epoch: int = 0
    step: int = 0
    num_workers: int | None = None
    examples_per_worker: int | None = None
    dataset: str | None = None
    order: str | None = None

    def __post_init__(self) -> None:
        for name in ("seed", "batch_size", "epoch", "step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"ReadState.{name} must be an int, got {value!r}")
        if self.batch_size < 1 or self.epoch < 0 or self.step < 0:
            raise ValueError(f"ReadState needs batch_size >= 1, epoch, step >= 0: {self}")
        for name in ("num_workers", "examples_per_worker"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ReadState.{name} must be a whole number >= 1, got {value!r}")

        for name in ("dataset", "order"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise TypeError(f"ReadState.{name} must be a str or None")

    def advance(self, steps: int) -> ReadState:
        """The state after ``steps`` more batches."""
        return dataclasses.replace(self, step=self.step + steps)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ReadState:
        fields = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - known
        if unknown:
            raise ValueError(f"not a ReadState: unknown fields {sorted(unknown)}")
        return cls(**fields)


def resume(data_dir: str, split: str, state: ReadState, options=None, **overrides):
    """A dataset that continues a seeded read from ``state``, and the state to advance.

    Same worker count: the dataset yields exactly the batches the
    uninterrupted read would have yielded from ``state.step`` on (same keys,
    order, crops, padding and mask), without reading or decoding what it
    skips. Another worker count: the files are dealt differently, so no
    worker can continue another's order; the read restarts the epoch that
    was in progress, on the new workers, so that epoch still reads every
    example exactly once (what was read of it before is read again). The
    returned state is then anchored at that epoch's start.

    Args:
        data_dir, split, options, overrides: as for ``reader.make_dataset``;
            ``seed`` comes from the state (a different one is an error).
        state: a :class:`ReadState` (new, or from ``ReadState.from_json``).

    Returns:
        (dataset, state): advance the state by the batches consumed and save it.
    """
    from reader.info import split_fingerprint, split_shards
    from reader.options import ReadOptions
    from reader.pipeline import make_dataset
    from reader.worker import worker_plan
    from schemas.info import load_info

    o = dataclasses.replace(options or ReadOptions(), **overrides)
    if o.seed is not None and o.seed != state.seed:
        raise ValueError(f"the state was saved with seed {state.seed}, options give {o.seed}")
    if o.start_step or o.start_epoch:
        raise ValueError("resume takes the start from the state: leave start_step/start_epoch 0")
    info = load_info(data_dir)
    _check_same_read(state, split_fingerprint(info, split), o.order(split), data_dir, split)
    n_workers, index = o.workers()
    shards = split_shards(info, data_dir, split)
    examples = worker_plan(shards, n_workers, index)[1]
    if state.num_workers in (None, n_workers):
        if state.examples_per_worker not in (None, examples):
            raise ValueError(
                f"the state was saved when each worker read {state.examples_per_worker} "
                f"examples of {split!r}, now {examples}: the split changed; start a new read"
            )
        state = dataclasses.replace(state, num_workers=n_workers, examples_per_worker=examples)
    else:
        epoch = state.epoch + state.step * state.batch_size // state.examples_per_worker
        log.warning(
            "resuming %d workers' read with %d workers: restarting epoch %d from its start "
            "so that it still reads every example once",
            state.num_workers,
            n_workers,
            epoch,
        )
        state = dataclasses.replace(
            state, epoch=epoch, step=0, num_workers=n_workers, examples_per_worker=examples
        )
    state = dataclasses.replace(state, dataset=split_fingerprint(info, split), order=o.order(split))
    ds = make_dataset(
        data_dir,
        split,
        state.batch_size,
        o,
        seed=state.seed,
        start_epoch=state.epoch,
        start_step=state.step,
    )
    return ds, state


def _check_same_read(state: ReadState, dataset: str, order: str, data_dir: str, split: str):
    """A state resumes only the read it was saved from: the same split's shards, and the
    options that shape the order; otherwise examples would be read twice or never."""
    if state.dataset not in (None, dataset):
        raise ValueError(
            f"the state was saved reading another version of split {split!r} (its shards' "
            f"checksums differ from those in {data_dir}: re-converted or replaced); "
            "resuming would read some examples twice and others never: start a new read"
        )
    if state.order in (None, order):
        return
    saved = dict(pair.split("=", 1) for pair in state.order.split())
    now = dict(pair.split("=", 1) for pair in order.split())
    changed = ", ".join(
        f"{k} {saved.get(k, 'unset')} -> {now.get(k, 'unset')}"
        for k in sorted(set(saved) | set(now))
        if saved.get(k) != now.get(k)
    )
    raise ValueError(
        f"the state was saved reading with other order options ({changed}): the order "
        "would differ and some examples would be read twice, others never; pass the "
        "options of the saved run, or start a new read"
    )
