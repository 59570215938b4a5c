"""The command line's defaults are the options' own: one place sets each."""

from __future__ import annotations

import pytest

from convert_core.options import ConvertOptions, parse_args
from evenshard.cli import build_parser
from reader.values.read_options import ReadOptions

pytestmark = pytest.mark.fast  # the unit lane: make test-fast


def test_convert_flags_default_to_the_options_defaults():
    parsed, rest = parse_args(["--input=images", "--output_dir=out"])
    assert parsed == ConvertOptions(input="images", output_dir="out") and rest == []


def test_shuffle_report_flags_default_to_the_readers_defaults():
    args = build_parser().parse_args(["shuffle-report", "out"])
    d = ReadOptions()
    assert (args.shuffle_buffer, args.cycle_length, args.block_length) == (
        d.shuffle_buffer,
        d.cycle_length,
        d.block_length,
    )


def test_a_name_that_is_no_read_option_is_named_with_the_closest():
    from reader.front.read import merge

    with pytest.raises(TypeError, match=r"'image_sise' is not a read option \(did you mean"):
        merge(None, {"image_sise": 3})
    with pytest.raises(TypeError, match="NumpyReader's and make_dataset's"):
        merge(None, {"view_spread": 2})
    assert merge(None, {"seed": 3}).seed == 3
