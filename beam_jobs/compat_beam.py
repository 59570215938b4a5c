"""Apache Beam's private names that evenshard relies on, and nowhere else.

Three places need Beam's internals: the Dask runner (``beam_jobs.dask_runner``) rebuilds
Beam's own translation of a ParDo and of Reshuffle, which Beam keeps private; the local
runner's workers (``beam_jobs.local_runner``); and Beam's inspection of each DoFn
(``remember_dofn_specs``), which it repeats for the same DoFn. ``check()`` says, naming
the installed version, when a release changes one of them (tests/test_compat.py runs
it). Checked with apache-beam 2.77.0.
"""

from __future__ import annotations

import weakref

from schemas.errors import OperationError


def is_reshuffle(transform) -> bool:
    """Whether ``transform`` is Beam's Reshuffle as the Dask runner's overrides leave it
    (the Dask runner repartitions there)."""
    from apache_beam.runners.dask.overrides import _Reshuffle

    return isinstance(transform, _Reshuffle)


def output_handler(window_fn, receivers):
    """The output handler a ``DoFnInvoker`` sends a DoFn's outputs through, to
    ``receivers`` (a Dask runner ``OneReceiver``: the main output at ``None``)."""
    from apache_beam.runners.common import _OutputHandler

    return _OutputHandler(
        window_fn=window_fn,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )


def side_input_view(side_input) -> tuple:
    """(its type, its view options, its window mapping) of an ``AsSingleton``/``AsDict``/
    ... side input: what a ``SideInputMap`` is built from."""
    return type(side_input), side_input._view_options(), side_input._window_mapping_fn


def bag_kwargs(dask_options: dict) -> dict:
    """The dask-bag keyword arguments among ``--dask_*`` options (``npartitions``...)."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    return DaskOptions._extract_bag_kwargs(dask_options)


def worker_command(handler) -> str:
    """The command line a ``SubprocessSdkWorkerHandler`` starts its worker with."""
    return handler._worker_command_line


def set_runner_defaults(runner, provision_info=None, environment=None) -> None:
    """Sets what a ``FnApiRunner`` gives its workers: the provision info (the pipeline's
    options) and the default environment (their command), each when given."""
    if provision_info is not None:
        runner._provision_info = provision_info
    if environment is not None:
        runner._default_environment = environment


def remembering(inspect_dofn):
    """``inspect_dofn`` (Beam's ``userstate.get_dofn_specs``: a DoFn's state and timer
    specs) run once a DoFn instance: its answer is kept while the DoFn lives (in
    ``.kept``), and each caller gets sets of its own. A DoFn without weak references,
    or a call with more arguments than the DoFn, is Beam's own each time."""
    kept: dict[int, tuple] = {}  # id(dofn): (a weak reference to it, its specs)

    def get_dofn_specs(dofn, *more, **named):
        if more or named:
            return inspect_dofn(dofn, *more, **named)
        key = id(dofn)
        known = kept.get(key)
        if known is not None and known[0]() is dofn:
            return set(known[1]), set(known[2])
        states, timers = inspect_dofn(dofn)

        def gone(ref, key=key):
            if kept.get(key, (None,))[0] is ref:
                del kept[key]

        try:
            kept[key] = (weakref.ref(dofn, gone), frozenset(states), frozenset(timers))
        except TypeError:
            pass
        return states, timers

    get_dofn_specs.remembers = inspect_dofn
    get_dofn_specs.kept = kept
    return get_dofn_specs


# Beam's modules that import get_dofn_specs by name, and so keep Beam's own: the legacy
# DirectRunner's, which evenshard never runs (its local runner is the FnApiRunner's)
_KEEP_BEAMS = {"apache_beam.runners.direct.transform_evaluator"}


def remember_dofn_specs() -> None:
    """Beam inspects each method of a DoFn (``inspect.signature``) every time it asks
    whether the DoFn has state or timers, and asks again and again of the same DoFn as
    a pipeline is built, translated and run: 550 inspections and some 17,000 signatures
    for a small convert's 135 DoFn instances. From this call on, in this whole process
    (a user's own later pipelines too), each DoFn instance is inspected once
    (``remembering``); a DoFn's methods do not change once it is in a ParDo.
    Idempotent. Beam's callers reach the function through its module (``check()``
    pins it in every Beam module loaded, but those of ``_KEEP_BEAMS``). A Beam without
    the function is left as it is: this is speed, never a reason for a convert to fail."""
    from apache_beam.transforms import userstate

    beams = getattr(userstate, "get_dofn_specs", None)
    if beams is not None and not hasattr(beams, "remembers"):
        userstate.get_dofn_specs = remembering(beams)


def _dofn_specs_bypassed(userstate, beams) -> list[str]:
    """The loaded Beam modules, but userstate and ``_KEEP_BEAMS``, that hold ``beams``
    (Beam's own ``get_dofn_specs``) under any name: they would not reach
    ``remembering``."""
    import sys

    return [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("apache_beam.")
        and module is not userstate
        and name not in _KEEP_BEAMS
        and any(value is beams for value in list(vars(module).values()))
    ]


def check() -> None:
    """Raises RuntimeError, naming the name and the installed Beam, unless each name
    above is where this module reads it."""
    import inspect

    import apache_beam as beam
    from apache_beam.runners.dask import overrides
    from apache_beam.runners.dask import transform_evaluator as te

    where = f"apache-beam {beam.__version__} (beam_jobs/compat_beam.py, checked with 2.77.0)"
    side = beam.pvalue.AsSingleton(beam.Pipeline() | beam.Create([1]))
    view, options, mapping = side_input_view(side)
    if view is not beam.pvalue.AsSingleton or not isinstance(options, dict) or not mapping:
        raise OperationError(f"{where}: side inputs changed _view_options/_window_mapping_fn")
    if not isinstance(bag_kwargs({"npartitions": 3}), dict):
        raise OperationError(f"{where}: DaskOptions._extract_bag_kwargs changed")
    try:
        output_handler(None, te.OneReceiver())
    except TypeError as e:
        raise OperationError(f"{where}: _OutputHandler changed its arguments: {e}") from None
    from apache_beam.runners.portability.fn_api_runner import fn_runner, worker_handlers

    runner = fn_runner.FnApiRunner()
    if not hasattr(runner, "_provision_info") or not hasattr(runner, "_default_environment"):
        raise OperationError(f"{where}: FnApiRunner keeps no _provision_info/_default_environment")
    handler = inspect.getsource(worker_handlers.SubprocessSdkWorkerHandler.__init__)
    if "self._worker_command_line = " not in handler:
        raise OperationError(f"{where}: SubprocessSdkWorkerHandler has no _worker_command_line")
    from apache_beam.runners.direct import direct_runner  # noqa: F401 - checked below
    from apache_beam.runners.worker import bundle_processor, operations  # noqa: F401
    from apache_beam.transforms import userstate

    beams = getattr(userstate.get_dofn_specs, "remembers", userstate.get_dofn_specs)
    if list(inspect.signature(beams).parameters) != ["dofn"]:
        raise OperationError(f"{where}: userstate.get_dofn_specs takes other arguments")
    for caller in (userstate.is_stateful_dofn, userstate.validate_stateful_dofn):
        if "get_dofn_specs" not in caller.__code__.co_names:
            asks = f"userstate.{caller.__name__} no longer asks get_dofn_specs"
            raise OperationError(f"{where}: {asks}")
    for name in _dofn_specs_bypassed(userstate, beams):
        raise OperationError(f"{where}: {name} imports userstate.get_dofn_specs itself")
    if not is_reshuffle(overrides._Reshuffle()):
        raise OperationError(f"{where}: the Dask runner's overrides have no _Reshuffle")
