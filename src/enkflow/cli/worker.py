"""``enkflow worker CYCLE_DIR`` or ``enkflow worker --board EXPDIR/board.json``: a pilot of the
dynamic running job scheme.

Launchers start it; users rarely do. It takes IDs from the cycle's to-do list until the list is
empty; with ``--board``, from each cycle the driver releases, until it is idle too long.
"""

from __future__ import annotations

import argparse

from enkflow.cli import COMMANDS
from enkflow.jobs.entry import add_arguments, start


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help=COMMANDS["worker"],
                       description=__doc__)
    add_arguments(p)
    p.set_defaults(func=lambda args: start(p, args))
