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
