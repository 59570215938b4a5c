"""The ``evenshard`` command: ``evenshard SUBCOMMAND [flags]``.

Every subcommand's flags are defined here; each calls one plain function of
the packages below (``beam_jobs.convert.convert``, ``audit.validate``,
``audit.summary``, ``audit.shuffle_report``, ``evenshard.synthetic``).
Heavy imports happen inside the subcommand that needs them, so ``--help`` is
instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from evenshard import __version__


def _convert_flags(p: argparse.ArgumentParser) -> None:
    from beam_jobs.options import DESCRIPTION, add_flags

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
    from reader.read_options import DEFAULT_CYCLE  # the reader's defaults
    from reader.read_options import ReadOptions as d

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
    from reader.read_options import ReadOptions as d

    a = p.add_argument
    a("data_dir", help="a folder written by evenshard convert")
    a("--split", default="train", help="split read")
    a("--steps", type=_steps, required=True, help="FIRST:STOP (STOP excluded), or one step")
    a("--batch_size", type=int, default=None, help="examples a batch (default: the state's, or 32)")
    a("--rank", type=int, default=0, help="the worker (rank) explained")
    a("--workers", type=int, default=1, help="workers (ranks) of the read")
    a("--state", default=None, help="a saved state (JSON file): steps continue its step")
    a("--seed", type=int, default=None, help="the read's seed (or give --state)")
    a("--epochs", type=int, default=None, help="passes over the split (default: endless)")
    a("--shuffle_buffer", type=int, default=d.shuffle_buffer, help="the read's shuffle_buffer")
    a("--cycle_length", type=int, default=d.cycle_length, help="the read's cycle_length")
    a("--block_length", type=int, default=d.block_length, help="the read's block_length")
    a("--no_shuffle", action="store_true", help="a read in file order")
    a("--random_crop", action="store_true", help="crops drawn: give each row's box")
    a("--random_flip", action="store_true", help="flips drawn: give each row's flip")
    a("--views", type=int, default=1, help="NumpyReader's views")
    a("--view_spread", default="together", help="NumpyReader's view_spread")
    a("--mirror_views", action="store_true", help="NumpyReader's mirror_views")
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


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line that names the fix, not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="evenshard",
        description="Globally shuffled, split, balanced TFRecord shards of image datasets.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"evenshard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for name, (add_flags, text) in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=text,
            description=text,
            allow_abbrev=False,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        add_flags(p)
    return parser


def run() -> None:
    """The ``evenshard`` command: ``main``, then out without Python's finalization.

    After a convert, tearing down a process that ran Beam (its modules, gRPC's
    core and threads) took 0.6 s with nothing left to do: every file is written,
    closed and in place before the summary is printed. An exception still ends
    the normal way, with its traceback.

    The process is the command's own, so a local convert refuses Beam's optional
    imports that it never uses (``beam_jobs.runners.lean_imports``) and stops its
    workers first on Ctrl-C (``evenshard.convert_command.stop_now``); Ctrl-C ends
    any subcommand with one line and exit code 130.
    """
    from beam_jobs import runners
    from evenshard import convert_command

    command = sys.argv[1] if len(sys.argv) > 1 else ""
    local = command == "convert" and runners.runs_locally(sys.argv[2:])
    if local:
        runners.lean_imports()
        signal.signal(signal.SIGINT, convert_command.stop_now)
    try:
        code = main()
    except KeyboardInterrupt:
        if not local:  # a local convert's handler said it already
            said = f"evenshard {command}: interrupted"
            print(convert_command.INTERRUPTED if command == "convert" else said, file=sys.stderr)
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit code (0 ok, 1 failed or problems, 2 usage)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command != "convert":  # only convert passes flags on (to Beam)
            parser.parse_args(argv)  # prints the usage error and exits 2
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else 2
    return _RUN[args.command](args, extra)


def _error(command: str, message: str) -> None:
    print(f"evenshard {command}: error: {message}", file=sys.stderr)


def _convert(args: argparse.Namespace, pipeline_args: list[str]) -> int:
    from evenshard import convert_command

    return convert_command.run(args, pipeline_args)


def _validate(args: argparse.Namespace, _) -> int:
    from audit.validate import validate

    try:
        problems = validate(args.data_dir, full=args.full, path_root=args.path_root)
    except OSError as e:  # a bucket that is not there, access denied, no network
        _error("validate", str(e))
        return 1
    if problems:
        print(f"evenshard validate: {len(problems)} problem(s) in {args.data_dir}")
        shown = problems[: args.max_problems] if args.max_problems > 0 else problems
        for line in shown:
            print(line)
        if len(problems) > len(shown):
            print(f"... and {len(problems) - len(shown)} more (--max_problems 0 shows all)")
        return 1
    print(f"evenshard validate: {args.data_dir} is valid" + (" (full)" if args.full else ""))
    return 0


def _leaks(args: argparse.Namespace, _) -> int:
    from audit import leaks
    from schemas.info import DatasetError
    from schemas.near import MAX_DISTANCE

    if not 0 <= args.distance <= MAX_DISTANCE:
        _error("leaks", f"--distance must be in [0, {MAX_DISTANCE}], got {args.distance}")
        return 2
    if args.top < 0 or args.max_leaked < 0:
        _error("leaks", "--top and --max_leaked must be >= 0")
        return 2
    try:
        if args.sheet:
            leaks.check_sheet(args.sheet)
        sides = [leaks.Side(args.data_dir, path_root=args.path_root)]
        if args.other:
            sides.append(leaks.Side(args.other, name="other:"))
        report = leaks.find(sides, args.distance, args.top)
        drawn = args.sheet and leaks.contact_sheet(sides, report, args.sheet)
    except (DatasetError, OSError, ValueError) as e:  # 2, not 1: a CI gate tells them apart
        _error("leaks", str(e))
        return 2
    print(leaks.to_json(report) if args.json else leaks.render(report))
    if args.sheet and not args.json:
        shown = args.sheet if drawn else "no pairs to show: no contact sheet written"
        print(f"  contact sheet: {shown}")
    leaked = report["leaked_images"]
    if args.gate == "convert":  # the wider rule's own pairs are shown, not counted
        leaked -= report["beyond_convert_rule"]
    return 1 if leaked > args.max_leaked else 0


def _inspect(args: argparse.Namespace, _) -> int:
    from audit.summary import render, summarize
    from schemas.info import DatasetError, load_info

    try:
        summary = summarize(load_info(args.data_dir))
    except (DatasetError, OSError) as e:
        _error("inspect", str(e))
        return 1
    print(json.dumps(summary, indent=2) if args.json else render(summary, args.data_dir))
    return 0


def _shuffle_report(args: argparse.Namespace, _) -> int:
    if args.epochs < 1 or args.batch_size < 1:
        _error("shuffle-report", "--epochs and --batch_size must be >= 1")
        return 2
    from audit.shuffle_report import render, report
    from schemas.info import DatasetError

    try:
        r = report(
            args.data_dir,
            args.split,
            args.out,
            args.baseline,
            args.baseline_buffer,
            args.epochs,
            args.batch_size,
            seed=args.seed,
            shuffle=not args.no_shuffle,
            shuffle_buffer=args.shuffle_buffer,
            cycle_length=args.cycle_length,
            block_length=args.block_length,
        )
    except (DatasetError, ValueError, OSError) as e:
        _error("shuffle-report", str(e))
        return 1
    except Exception as e:  # from inside tf.data (a shard of a bucket gone, say)
        if not type(e).__module__.startswith("tensorflow"):
            raise
        from reader import one_line

        _error("shuffle-report", one_line(e))
        return 1
    print(json.dumps(r, indent=2) if args.json else render(r))
    return 0


def _make_images(args: argparse.Namespace, _) -> int:
    from evenshard.synthetic import make_image_folder
    from schemas.images import EXTENSION

    formats = tuple(args.formats.split(","))
    unknown = [f for f in formats if f not in EXTENSION]
    if unknown:
        _error(
            "make-images", f"--formats: unknown {', '.join(unknown)}; use {', '.join(EXTENSION)}"
        )
        return 2
    broken = make_image_folder(
        args.root,
        args.num_labels,
        args.per_label,
        formats,
        (args.height, args.width),
        args.seed,
        args.broken,
    )
    print(
        f"wrote {args.num_labels * args.per_label} images in {args.num_labels} labels"
        f" and {len(broken)} broken files under {args.root}"
    )
    return 0


def _explain(args: argparse.Namespace, _) -> int:
    from reader import explain
    from schemas.info import DatasetError

    spread = args.view_spread
    try:
        state = None
        if args.state:
            with open(args.state) as f:
                state = json.load(f)
        if args.batch_size is None:  # the state's own, as a resumed read takes it
            saved = state.get("read_state", state) if isinstance(state, dict) else {}
            saved = json.loads(saved) if isinstance(saved, str) else saved
            args.batch_size = saved.get("batch_size") or 32
        batches = explain.explain(
            args.data_dir,
            args.split,
            args.batch_size,
            args.steps,
            state=state,
            views=args.views,
            view_spread=int(spread) if spread.isdigit() else spread,
            mirror_views=args.mirror_views,
            num_workers=args.workers,
            worker_index=args.rank,
            seed=args.seed,
            epochs=args.epochs,
            shuffle=False if args.no_shuffle else None,
            shuffle_buffer=args.shuffle_buffer,
            cycle_length=args.cycle_length,
            block_length=args.block_length,
            random_crop=args.random_crop,
            random_flip=args.random_flip,
        )
    except (DatasetError, ValueError, TypeError, OSError) as e:
        _error("explain", str(e).splitlines()[0])
        return 1
    print(explain.to_json(batches) if args.json else explain.render(batches))
    return 0


_RUN = {
    "convert": _convert,
    "validate": _validate,
    "inspect": _inspect,
    "leaks": _leaks,
    "shuffle-report": _shuffle_report,
    "make-images": _make_images,
    "explain": _explain,
}


if __name__ == "__main__":
    run()
