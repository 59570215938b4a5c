"""Beam's PipelineOptions, each view made once.

Beam makes a new view on every ``view_as``: an argparse parser of the view's
flags, then a parse of every flag given. Building and translating the convert
pipeline asks for views about 500 times (each transform applied asks for two or
three), 0.3 s of the driver's start before any image is read. A view holds no
values of its own (every view of one options object shares its values), so one
view a class serves every ask.
"""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions


class BeamOptions(PipelineOptions):
    """``PipelineOptions`` whose ``view_as`` makes each view once; a copy or a pickle
    leaves the views out (the copy makes its own)."""

    def view_as(self, cls):
        views = self.__dict__.setdefault("_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state
