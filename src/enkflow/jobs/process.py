"""Whether a process still runs: what the worker's claims and the local launcher's jobs are checked with."""

from __future__ import annotations

import psutil


def process_alive(pid: int, ctime: float | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if given, was created at ``ctime`` (s)."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return ctime is None or abs(p.create_time() - ctime) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def runs_a_step(pid: int, steps: list[list[str]]) -> bool:
    """Whether process ``pid`` runs one of ``steps`` (its arguments after the program are the end of
    the step's: a step may be prefixed by an MPI launcher)."""
    try:
        args = psutil.Process(pid).cmdline()[1:]
    except psutil.Error:
        return False
    return bool(args) and any(argv[-len(args):] == args for argv in steps if len(argv) >= len(args))
