"""The ``evenshard`` command: ``evenshard SUBCOMMAND [flags]``."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with main(argv), one-line help)
COMMANDS = {
    "convert": ("beam_jobs.convert", "image folder or manifest -> shuffled, balanced shards"),
    "validate": ("schemas.validate", "check a dataset against its info, schema and files"),
    "inspect": ("schemas.summary", "summarize a dataset: splits, shards, labels, rejects"),
    "shuffle-report": ("reader.shuffle_report", "measure and plot how well reading mixes a split"),
    "make-images": ("beam_jobs.synthetic", "write a folder of generated test images"),
}


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None):
    """``parser.parse_args`` that never exits the process.

    Returns:
        (args, 0), or (None, exit code) once argparse has printed help (0) or
        a usage error (2): subcommands return the code from their ``main``.
    """
    try:
        return parser.parse_args(argv), 0
    except SystemExit as e:
        return None, 2 if e.code else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = ["usage: evenshard SUBCOMMAND [flags]  (evenshard SUBCOMMAND --help)", ""]
        lines += [f"  {name:<16}{text}" for name, (_, text) in COMMANDS.items()]
        unknown = bool(argv) and argv[0] not in ("-h", "--help")
        if unknown:
            lines.insert(0, f"evenshard: error: unknown subcommand {argv[0]!r}")
        print("\n".join(lines), file=sys.stderr if unknown or not argv else sys.stdout)
        return 2 if unknown or not argv else 0
    module, _ = COMMANDS[argv[0]]
    return importlib.import_module(module).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
