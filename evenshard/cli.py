"""The ``evenshard`` command: ``evenshard SUBCOMMAND [flags]``.

Every subcommand's flags are defined in ``evenshard.cli_flags``; each calls one plain function of
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
import re
import signal
import sys

from evenshard import __version__
from evenshard.cli_flags import COMMANDS


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
    except BrokenPipeError:  # `evenshard inspect --json | head`: the reader left early
        code = 0
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass  # what was left for a reader that left
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit code (0 ok, 1 failed or problems, 2 usage)."""
    argv = _values_joined(sys.argv[1:] if argv is None else list(argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command != "convert":  # only convert passes flags on (to Beam)
            parser.parse_args(argv)  # prints the usage error and exits 2
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else 2
    return _RUN[args.command](args, extra)


def _values_joined(argv: list[str]) -> list[str]:
    """``argv`` with ``--flag -3:2`` as ``--flag=-3:2``: argparse takes a word that starts
    with "-" for a flag unless it is a plain negative number, so ``explain --steps -3:2``
    ended in "expected one argument" instead of what is wrong with the range. No flag of
    evenshard starts with "-" and a digit."""
    out: list[str] = []
    for word in argv:
        if out and re.match(r"-\d", word) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _same_folder(a: str, b: str) -> bool:
    """Whether two dataset paths are one folder (bucket paths: the same text)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # a bucket, or a folder that is not there (said later)
        return a.rstrip("/") == b.rstrip("/")


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
    from audit import leaks, sheet
    from schemas.info import DatasetError
    from schemas.near import MAX_DISTANCE

    if not 0 <= args.distance <= MAX_DISTANCE:
        _error("leaks", f"--distance must be in [0, {MAX_DISTANCE}], got {args.distance}")
        return 2
    if args.top < 0 or args.max_leaked < 0:
        _error("leaks", "--top and --max_leaked must be >= 0")
        return 2
    if args.other and _same_folder(args.data_dir, args.other):
        _error(
            "leaks",
            f"OTHER {args.other} is DATASET itself: every image would be its own leak; "
            "name another converted dataset, or leave OTHER out to audit DATASET's splits",
        )
        return 2
    try:
        if args.sheet:
            sheet.check_sheet(args.sheet)
        sides = [leaks.Side(args.data_dir, path_root=args.path_root)]
        if args.other:
            sides.append(leaks.Side(args.other, name="other:", like=sides[0]))
        report = leaks.find(sides, args.distance, args.top)
        drawn = args.sheet and sheet.contact_sheet(sides, report, args.sheet)
    except (DatasetError, OSError, ValueError) as e:  # 2, not 1: a CI gate tells them apart
        _error("leaks", str(e))
        return 2
    print(leaks.to_json(report) if args.json else leaks.render(report))
    if args.sheet and not args.json:
        listed = len(report["closest"])
        if drawn:
            of = f" (the closest {drawn} of the {listed} pairs listed)" if drawn < listed else ""
            shown = f"{args.sheet}{of}"
        elif args.top == 0:
            shown = "--top 0 lists no pairs: no contact sheet written"
        else:
            shown = "no pairs to show: no contact sheet written"
        print(f"  contact sheet: {shown}")
    leaked = report["leaked_images"]
    if args.gate == "convert":  # the wider rule's own pairs are shown, not counted
        leaked -= report["beyond_convert_rule"]
    if leaked > args.max_leaked:  # the gate: said on stderr, the report stays clean JSON
        rule = "by convert's rule" if args.gate == "convert" else "by either rule"
        print(
            f"evenshard leaks: exit 1: {leaked} images leaked {rule}, more than "
            f"--max_leaked {args.max_leaked}",
            file=sys.stderr,
        )
        return 1
    return 0


def _inspect(args: argparse.Namespace, _) -> int:
    from audit.summary import render, summarize
    from schemas.dataset_info import load_dataset_info
    from schemas.info import DatasetError

    try:
        summary = summarize(load_dataset_info(args.data_dir))
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
            random_access=False if args.no_random_access else None,
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
    if os.path.isdir(args.root) and os.listdir(args.root):
        _error(
            "make-images",
            f"{args.root} is not empty: its images would mix with the new ones; give a "
            "new folder, or remove this one first",
        )
        return 2
    above = args.root
    while above and not os.path.isdir(above):  # the nearest part of the path that exists
        if os.path.lexists(above):
            _error("make-images", f"{above} is a file, not a folder: give a new folder's path")
            return 2
        above = os.path.dirname(above.rstrip("/"))
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
            epochs=args.epochs or None,  # 0: endless
            shuffle=False if args.no_shuffle else None,
            shuffle_buffer=args.shuffle_buffer,
            cycle_length=args.cycle_length,
            block_length=args.block_length,
            random_access=False if args.no_random_access else None,
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
