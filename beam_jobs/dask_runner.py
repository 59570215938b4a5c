"""Beam's DaskRunner, with each step computed once and Reshuffle spreading work.

Beam's DaskRunner (``apache_beam.runners.dask``) turns a pipeline into one
lazy dask-bag graph. Two things in its translation cost convert most of its
time (measured on 5,000 images, benchmarks/RESULTS.md):

- **Side inputs are recomputed in every task that reads them.** A side input
  is handed to the DoFn as a lazy bag that each task computes for itself, so
  the whole graph upstream of it runs again: Beam's runner listed the folder
  14 times and inspected every image 11 times, once per task reading the
  plan, vocabulary, gate or rank table.
- **Reshuffle does nothing**, so a folder listed in one task stays one
  partition and every image is inspected by one worker.
- **What a DoFn emits in finish_bundle is lost**: the task collects its
  outputs before calling it (convert's shard batches are sent there).

This runner keeps Beam's translation of each transform (Create, ParDo run a
partition at a time, GroupByKey as ``bag.groupby``, Flatten) and changes how
the steps are tied together: a step whose output has more than one consumer
(side inputs included) is persisted on the cluster when the graph is built,
so it runs once and its consumers read the result; side inputs reach a task
as computed lists; finish_bundle's outputs are kept; Reshuffle repartitions
the bag into ``--dask_npartitions`` parts (default: 4 a worker). ``--runner=dask`` selects
it (beam_jobs/runners.py).
"""

from __future__ import annotations

import collections
import itertools

from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.dask import transform_evaluator as te
from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunnerResult
from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner
from apache_beam.runners.dask.overrides import dask_overrides
from apache_beam.transforms.sideinputs import SideInputMap

from beam_jobs import compat_beam

PARTITIONS_A_WORKER = 4


def _whole(partition) -> list:
    return list(partition)


def _concat(partitions) -> list:
    return list(itertools.chain.from_iterable(partitions))


def _bundle(items, step, views, *side_values):
    """One partition through a DoFn, with side inputs built from computed lists.

    The receivers and invoker are made here, per task (Beam's translation
    puts one receiver list in the graph for all of a step's tasks), and the
    outputs are collected after finish_bundle.
    """
    fn, label, window_fn, args, kwargs = step
    sides = [
        SideInputMap(view, options, [te.get_windowed_value(v, wfn) for v in values])
        for (view, options, wfn), values in zip(views, side_values)
    ]
    receivers = te.OneReceiver()
    handler = compat_beam.output_handler(window_fn, receivers)
    invoker = te.DoFnInvoker.create_invoker(
        te.DoFnSignature(fn),
        handler,
        context=te.DoFnContext(label, state=None),
        side_inputs=sides,
        input_args=list(args),
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=te.DoFn.BundleFinalizerParam(),
    )
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(item)
    # Beam's apply_dofn_to_bundle collects the outputs before finish_bundle, so
    # what a DoFn emits there is lost; here they are collected after it.
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return [v.value for v in receivers.values]


def _par_do(applied, input_bag, side_items):
    """Beam's ParDo translation (transform_evaluator.ParDo), side inputs as computed lists."""
    transform = applied.transform
    args, kwargs = transform.raw_side_inputs
    main_input = next(iter(applied.main_inputs.values()))
    window_fn = getattr(getattr(main_input, "windowing", None), "windowfn", None)
    views = [compat_beam.side_input_view(si) for si in applied.side_inputs]
    step = (transform.fn, transform.label, window_fn, args, kwargs)
    return input_bag.map(te.get_windowed_value, window_fn).map_partitions(
        _bundle, step, views, *side_items
    )


class _Consumers(PipelineVisitor):
    """How many steps read each step's output (as main or side input)."""

    def __init__(self):
        self.count = collections.Counter()

    def visit_transform(self, node) -> None:
        for value in node.inputs:
            if not isinstance(value, pvalue.PBegin):
                self.count[value.producer] += 1
        for si in node.side_inputs:
            self.count[si.pvalue.producer] += 1


class _Translate(PipelineVisitor):
    def __init__(self, client, bag_kwargs: dict, consumers: collections.Counter):
        self.client, self.bag_kwargs, self.consumers = client, bag_kwargs, consumers
        self.bags = collections.OrderedDict()
        workers = len(client.scheduler_info().get("workers", {})) or 1
        self.partitions = bag_kwargs.get("npartitions") or PARTITIONS_A_WORKER * workers

    def visit_transform(self, node) -> None:
        inputs = [self.bags[v.producer] for v in node.inputs if v.producer in self.bags]
        transform = node.transform
        if transform.__class__ is te.apache_beam.ParDo:  # exact: subclasses are NoOps there
            sides = [
                self.bags[si.pvalue.producer].reduction(_whole, _concat) for si in node.side_inputs
            ]
            bag = _par_do(node, inputs[0], sides)
        elif compat_beam.is_reshuffle(transform):
            bag = inputs[0].repartition(self.partitions)
        else:
            assert not node.side_inputs, node.full_label
            op_class = te.TRANSLATIONS.get(transform.__class__, te.NoOp)
            op = op_class(node, bag_kwargs=self.bag_kwargs)
            if op_class is te.Flatten:
                bag = op.apply(inputs)
            else:
                bag = op.apply(inputs[0] if inputs else None)
        if bag is not None and self.consumers[node] > 1:
            bag = self.client.persist(bag)  # read by several steps: compute it once
        self.bags[node] = bag


class DaskRunner(BeamDaskRunner):
    """Beam's DaskRunner, each step computed once; see the module doc."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        dask_options = options.view_as(DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = compat_beam.bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        pipeline.replace_all(dask_overrides())
        consumers = _Consumers()
        pipeline.visit(consumers)
        translate = _Translate(client, bag_kwargs, consumers.count)
        pipeline.visit(translate)
        last = list(translate.bags.values())[-1]
        return DaskRunnerResult(client, [client.compute(last)])
