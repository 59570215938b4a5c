"""``python -m evenshard``: the same as the ``evenshard`` command."""

from evenshard.cli import run

run()
