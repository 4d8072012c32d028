"""``enkflow worker CYCLE_DIR``: a pilot worker of the dynamic running job scheme.

Launchers start it; users rarely do. It takes IDs from the cycle's to-do
list until the list is empty.
"""

from __future__ import annotations

import argparse

from enkflow.cli import COMMANDS
from enkflow.jobs.worker import add_arguments, run_worker


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help=COMMANDS["worker"],
                       description=__doc__)
    add_arguments(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    return run_worker(args.cycle_dir, worker_id=args.worker_id, threads=args.threads, only=args.task,
                      time_limit_s=args.time_limit)
