"""Each ``evenshard`` subcommand's flags, and the table of subcommands
(``COMMANDS``: name -> (the function adding its flags, one line of help)).

Heavy imports happen inside the function that needs them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse

# the read's random_access=False: the shuffle_buffer, cycle_length and block_length
# flags shape that order only (a local read is otherwise one permutation an epoch)
RUNS_HELP = (
    "read local shards in runs and windows, as a bucket is read (random_access=False; "
    "the buffer, cycle and block flags shape only that order)"
)


def _convert_flags(p: argparse.ArgumentParser) -> None:
    from convert_core.options import DESCRIPTION, add_flags

    p.description = DESCRIPTION
    add_flags(p)


def _validate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", help="a folder written by evenshard convert")
    p.add_argument("--full", action="store_true", help="also parse every record and image")
    p.add_argument(
        "--path_root", default=None, help="path records: where the images are now, if they moved"
    )
    p.add_argument("--max_problems", type=int, default=20, help="problem lines to print (0: all)")


def _inspect_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", help="a folder written by evenshard convert")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _leaks_flags(p: argparse.ArgumentParser) -> None:
    from schemas.near import AUDIT_DISTANCE

    a = p.add_argument
    a("data_dir", help="a folder written by evenshard convert")
    a("other", nargs="?", default=None, help="a second dataset: its images against DATA_DIR's")
    a(
        "--distance",
        type=int,
        default=AUDIT_DISTANCE,
        help="bits within which images match (wider than convert's, to see what it missed)",
    )
    a("--top", type=int, default=20, help="closest pairs to list (0: none)")
    a("--sheet", default=None, help="a .png to draw the closest pairs in, side by side")
    a(
        "--max_leaked",
        type=int,
        default=0,
        help="exit 1 when more images than this have a near-duplicate across (errors: 2)",
    )
    a(
        "--gate",
        choices=("convert", "audit"),
        default="convert",
        help="which pairs --max_leaked counts: those convert's rule matches (default), or "
        "also those only the audit's wider rule matches (marked *: more found, more false)",
    )
    a(
        "--path_root",
        default=None,
        help="path records: where DATA_DIR's images are now, if they moved",
    )
    a("--json", action="store_true", help="print the report as JSON")


def _shuffle_report_flags(p: argparse.ArgumentParser) -> None:
    from reader.values.read_options import DEFAULT_CYCLE  # the reader's defaults
    from reader.values.read_options import ReadOptions as d

    a = p.add_argument
    a("data_dir", help="a folder written by evenshard convert")
    a("--split", default="train", help="split to read")
    a("--out", default="shuffle_report.png", help="PNG to write")
    a(
        "--batch_size",
        type=int,
        default=256,
        help="examples a batch (the mix is measured per batch)",
    )
    a("--epochs", type=int, default=2, help=">= 2 to measure neighbour repeats")
    a("--seed", type=int, default=0, help="the reader's seed")
    a(
        "--shuffle_buffer",
        type=int,
        default=d.shuffle_buffer,
        help="records the reader permutes together (a window)",
    )
    a(
        "--cycle_length",
        type=int,
        default=d.cycle_length,
        help=f"runs of records read at once (None: {DEFAULT_CYCLE})",
    )
    a("--block_length", type=int, default=d.block_length, help="records taken from a file in turn")
    a("--no_random_access", action="store_true", help=RUNS_HELP)
    a("--no_shuffle", action="store_true", help="read in file order")
    a(
        "--baseline",
        action="store_true",
        help="compare with tf.data shuffle(buffer) of one sorted file",
    )
    a(
        "--baseline_buffer",
        type=int,
        default=None,
        help="shuffle buffer of the baseline (default: a tenth of the split, at most 10,000)",
    )
    a("--json", action="store_true", help="print the figures as JSON")


def _make_images_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("root", help="folder to write (label sub-folders)")
    a("--num_labels", type=int, default=5, help="label folders")
    a("--per_label", type=int, default=100, help="images per label")
    a("--formats", default="jpeg,png", help="comma list of jpeg,png,gif,bmp,webp")
    a("--height", type=int, default=24, help="image height (varies by up to 7)")
    a("--width", type=int, default=32, help="image width (varies by up to 7)")
    a("--seed", type=int, default=0, help="seed of the pixels and sizes")
    a("--broken", action="store_true", help="add files that must be rejected")


def _steps(text: str) -> range:
    """``A:B`` (steps A to B - 1) or ``A`` (one step)."""
    first, _, stop = text.partition(":")
    try:
        steps = range(int(first), int(stop) if stop else int(first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give FIRST:STOP or one step, got {text!r}") from None
    if not steps or steps.start < 0:
        raise argparse.ArgumentTypeError(f"FIRST:STOP with 0 <= FIRST < STOP, got {text!r}")
    return steps


def _explain_flags(p: argparse.ArgumentParser) -> None:
    from reader.values.read_options import ReadOptions as d

    a = p.add_argument
    a("data_dir", help="a folder written by evenshard convert")
    a("--split", default="train", help="split read")
    a("--steps", type=_steps, required=True, help="FIRST:STOP (STOP excluded), or one step")
    a("--batch_size", type=int, default=None, help="examples a batch (default: the state's, or 32)")
    a("--rank", type=int, default=0, help="the worker (rank) explained")
    a("--workers", type=int, default=1, help="workers (ranks) of the read")
    a("--state", default=None, help="a saved state (JSON file): steps continue its step")
    a("--seed", type=int, default=None, help="the read's seed (or give --state)")
    a("--epochs", type=int, default=d.epochs, help="passes over the split (0: endless)")
    a("--shuffle_buffer", type=int, default=d.shuffle_buffer, help="the read's shuffle_buffer")
    a("--cycle_length", type=int, default=d.cycle_length, help="the read's cycle_length")
    a("--block_length", type=int, default=d.block_length, help="the read's block_length")
    a("--no_random_access", action="store_true", help=RUNS_HELP)
    a("--no_shuffle", action="store_true", help="a read in file order")
    a("--random_crop", action="store_true", help="crops drawn: give each row's box")
    a("--random_flip", action="store_true", help="flips drawn: give each row's flip")
    a("--views", type=int, default=1, help="the read's views")
    a(
        "--view_spread",
        default="together",
        help="the read's view_spread (NumpyReader, make_dataset)",
    )
    a("--mirror_views", action="store_true", help="the read's mirror_views")
    a("--json", action="store_true", help="print the batches as JSON")


# subcommand -> (flags, one-line help)
COMMANDS = {
    "convert": (_convert_flags, "image folder or manifest -> shuffled, balanced shards"),
    "validate": (_validate_flags, "check a dataset against its info, schema and files"),
    "inspect": (_inspect_flags, "summarize a dataset: splits, shards, labels, rejects"),
    "leaks": (_leaks_flags, "near-duplicates across splits, or between two datasets"),
    "shuffle-report": (_shuffle_report_flags, "measure and plot how well reading mixes a split"),
    "make-images": (_make_images_flags, "write a folder of generated sample images"),
    "explain": (_explain_flags, "the keys (views, crops, epochs) of each batch of some steps"),
}
