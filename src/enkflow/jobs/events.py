"""The JSON-lines event log of an experiment (``events.jsonl``).

Every process of an experiment (driver, pilot workers, the analysis) appends
one JSON object per line. Each line is written with a single ``write`` on a
file opened with ``O_APPEND``, so lines from concurrent writers do not
interleave. Times are POSIX seconds (``t``, float); durations end in ``_s``
and are seconds.

Event names (``event`` field) and their extra fields:

``cycle_start`` / ``cycle_end``       cycle
``job_submit``                        cycle, job, role, strategy
``job_start`` / ``job_end``           cycle, job, worker
``job_cancel``                        cycle, job
``task_start``                        cycle, task, member|None, worker, attempt
``task_end``                          cycle, task, member, worker, run_s, io_s, timings
``task_protect``                      cycle, task, member, how (reflink, copy_file_range, copy, link), protect_s
``task_restore``                      cycle, task, member (a rerun starts from the protected restart)
``task_unchanged``                    cycle, task, member, argv, restart (exit 0, restart untouched: a warning)
``task_fail``                         cycle, task, member, returncode, stderr_tail, argv
``task_requeue``                      cycle, task, reason (time-limit, sigterm, stale)
``experiment_start`` / ``experiment_end`` / ``resume``
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

from enkflow.fsutil import append_line


class EventLog:
    """Append-only JSON-lines log at ``path``; safe for many writers."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event stamped with the current time; returns the record."""
        rec = {"t": time.time(), "event": event, "pid": os.getpid(), **fields}
        append_line(self.path, (json.dumps(rec, sort_keys=True, default=str) + "\n").encode())
        return rec

    def read(self) -> list[dict[str, Any]]:
        """Every complete event, in file order (a torn last line after a crash is skipped)."""
        return list(iter_events(self.path))


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The events of a log file; lines that are not complete JSON objects are skipped."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec
