"""``python -m evenshard``: the same as the ``evenshard`` command."""

import sys

from evenshard.cli import main

sys.exit(main())
