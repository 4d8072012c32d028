"""The command line of a pilot, as launchers start it (``python -m enkflow.jobs``, ``enkflow worker``):
on one cycle's directory (:mod:`enkflow.jobs.worker`), or with ``--board`` over the study's cycles
(:mod:`enkflow.jobs.pilot`)."""

from __future__ import annotations

import argparse

from enkflow.jobs.pilot import run_pilot
from enkflow.jobs.worker import run_worker


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's command-line options (shared by ``enkflow worker`` and ``python -m enkflow.jobs``)."""
    p.add_argument("cycle_dir", nargs="?", help="the cycle directory (EXPDIR/cycles/NNNN) holding tasks.json and todo.json")
    p.add_argument("--board", default=None, metavar="FILE",
                   help="instead of one cycle: the study's board (EXPDIR/board.json); the pilot works each cycle "
                        "the driver releases there")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop after S seconds, putting the running task back at the front of the list")
    p.add_argument("--idle-timeout", type=float, default=120.0, metavar="S",
                   help="with --board: leave after S seconds without a task (default 120)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="run N tasks side by side (one big job)")
    p.add_argument("--task", type=int, default=None, metavar="ID", help="run only this task ID (one job per member)")
    p.add_argument("--cpus", type=int, default=None, metavar="N",
                   help="the job's CPUs: tasks that need more (a parallel analysis) are left to other jobs")
    p.add_argument("--worker-id", default=None, help="name in claims and events (default host-pid)")


def start(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """Run what the parsed options ``a`` of ``p`` ask for; returns the exit status."""
    if (a.board is None) == (a.cycle_dir is None):
        p.error("give either a cycle directory or --board")
    if a.board is not None:
        if a.task is not None:
            p.error("--board runs tasks of any ID (no --task)")
        return run_pilot(a.board, worker_id=a.worker_id, time_limit_s=a.time_limit, idle_timeout_s=a.idle_timeout,
                         threads=a.threads, cpus=a.cpus)
    return run_worker(a.cycle_dir, worker_id=a.worker_id, threads=a.threads, only=a.task, time_limit_s=a.time_limit,
                      cpus=a.cpus)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m enkflow.jobs``: what launchers start (lighter than the full CLI)."""
    p = argparse.ArgumentParser(prog="enkflow worker", description="pilot worker of the dynamic running job scheme")
    add_arguments(p)
    return start(p, p.parse_args(argv))
