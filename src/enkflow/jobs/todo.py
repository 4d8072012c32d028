"""The to-do list of one cycle: member IDs, then the analysis task.

Zheng et al. (GMD 2020, sect. 3.2): the list lives on the shared file system
and is modified only under an exclusive lock; pilot workers take IDs from its
front until it is empty. The analysis (ID ``n_members + 1``) is taken only once
every member is confirmed done.

Layout of the JSON file (rewritten atomically under the lock)::

    {"n_members": N, "analysis": N+1,
     "pending": [ids, front first],
     "claims":  {"id": {"worker", "host", "pid", "pid_ctime", "job", "since", "attempt"}},
     "done":    [ids],
     "failures": {"id": count of non-zero exits},
     "requeues": {"id": count of requeues after time limit, SIGTERM or a dead worker},
     "failed":  {"id": {"returncode", "stderr_tail", "argv", "log"}}}

The lock is ``fcntl.lockf`` on a separate, never-renamed ``todo.lock`` file
(POSIX locks work on NFS and Lustre mounted with locking); a
``threading.Lock`` serializes threads of one process, which POSIX locks do not.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator

from enkflow.errors import EnkflowError
from enkflow.jobs.files import read_json, write_json_atomic


class Take(Enum):
    """What :meth:`TodoList.claim` says when it hands out no task."""

    EMPTY = "empty"  # nothing pending: the worker may exit
    WAIT = "wait"  # only the analysis is pending and members are still running
    ABORT = "abort"  # a task failed for good: every worker stops


@dataclass(frozen=True)
class Claimant:
    """Who holds a task: enough to tell later whether it is still alive.

    ``pid_ctime`` is the process creation time (s since the epoch), which
    tells a live process from a new one that reused the PID.
    """

    worker: str
    host: str
    pid: int
    pid_ctime: float
    job: str

    def record(self, attempt: int) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "host": self.host,
            "pid": self.pid,
            "pid_ctime": self.pid_ctime,
            "job": self.job,
            "since": time.time(),
            "attempt": attempt,
        }


class TodoList:
    """One cycle's to-do list at ``directory/todo.json``.

    Instances are cheap; every method takes the lock, reads the file, and
    (for changes) rewrites it before releasing the lock.
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)
        self.path = self.dir / "todo.json"
        self.lock_path = self.dir / "todo.lock"
        self._tlock = threading.Lock()

    # -- creation and locking -------------------------------------------------

    @classmethod
    def create(cls, directory: str | os.PathLike[str], n_members: int) -> "TodoList":
        """A fresh list ``[1..n_members, n_members+1]``; an existing list is kept (resume)."""
        todo = cls(directory)
        todo.dir.mkdir(parents=True, exist_ok=True)
        with todo._locked():
            if not todo.path.exists():
                write_json_atomic(
                    todo.path,
                    {
                        "n_members": n_members,
                        "analysis": n_members + 1,
                        "pending": list(range(1, n_members + 2)),
                        "claims": {},
                        "done": [],
                        "failures": {},
                        "requeues": {},
                        "failed": {},
                    },
                )
        return todo

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._tlock:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield
            finally:
                # Closing the descriptor drops the POSIX lock.
                os.close(fd)

    def _load(self) -> dict[str, Any]:
        data = read_json(self.path)
        if data is None:
            raise EnkflowError(f"{self.path}: to-do list missing (was the cycle directory removed?)")
        return data

    @contextmanager
    def _edit(self) -> Iterator[dict[str, Any]]:
        with self._locked():
            data = self._load()
            yield data
            write_json_atomic(self.path, data)

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of the list (taken under the lock)."""
        with self._locked():
            return self._load()

    # -- the operations of the scheme ----------------------------------------

    def claim(self, who: Claimant, only: int | None = None, skip: frozenset[int] = frozenset()) -> int | Take:
        """Take the first pending task (or task ``only``) not in ``skip`` (tasks the claimant cannot
        run: it has too few CPUs); :class:`Take` when there is none.

        The analysis is handed out only when every member is in ``done``; while
        members are still pending or running the answer is ``Take.WAIT`` (``Take.EMPTY``
        for a claimant that skips the analysis).
        """
        with self._locked():
            data = self._load()
            if data["failed"]:
                return Take.ABORT
            pending: list[int] = data["pending"]
            analysis = data["analysis"]
            members_done = len(data["done"]) - (analysis in data["done"]) == data["n_members"]
            candidates = [t for t in pending if (only is None or t == only) and t not in skip]
            for task in candidates:
                if task == analysis and not members_done:
                    continue
                pending.remove(task)
                attempt = data["failures"].get(str(task), 0) + data["requeues"].get(str(task), 0) + 1
                data["claims"][str(task)] = who.record(attempt)
                write_json_atomic(self.path, data)
                return task
            # Nothing to take now. Only the analysis can be left in `pending` (members
            # are always takeable), so wait for it while members run; otherwise leave.
            if (only is not None and only != analysis) or analysis in skip:
                return Take.EMPTY
            return Take.WAIT if analysis in pending else Take.EMPTY

    def complete(self, task: int, who: Claimant) -> None:
        """Mark ``task`` done (after its done-marker was written)."""
        with self._edit() as data:
            data["claims"].pop(str(task), None)
            if task in data["pending"]:
                data["pending"].remove(task)
            if task not in data["done"]:
                data["done"].append(task)

    def requeue(self, task: int, *, reason: str) -> None:
        """Put ``task`` back at the front of the list (time limit, SIGTERM, dead worker)."""
        with self._edit() as data:
            self._requeue(data, task)

    @staticmethod
    def _requeue(data: dict[str, Any], task: int) -> None:
        data["claims"].pop(str(task), None)
        if task not in data["done"] and task not in data["pending"]:
            data["pending"].insert(0, task)
            data["requeues"][str(task)] = data["requeues"].get(str(task), 0) + 1

    def fail(self, task: int, *, max_attempts: int, report: dict[str, Any]) -> bool:
        """Record a non-zero exit of ``task``; requeue it at the front, or mark it failed.

        Returns True when ``task`` has now failed ``max_attempts`` times: the
        experiment must stop, and ``report`` (returncode, stderr tail, argv)
        is kept for the error message.
        """
        with self._edit() as data:
            key = str(task)
            data["claims"].pop(key, None)
            n = data["failures"].get(key, 0) + 1
            data["failures"][key] = n
            if n >= max_attempts:
                data["failed"][key] = report
                return True
            if task not in data["pending"] and task not in data["done"]:
                data["pending"].insert(0, task)
            return False

    def reset_failed(self) -> list[int]:
        """Put every failed task back at the front with its failure count cleared (``enkflow run
        --retry-failed``, after the user fixed the cause); returns their IDs."""
        with self._edit() as data:
            reset = sorted(int(k) for k in data["failed"])
            for task in reversed(reset):
                data["failed"].pop(str(task), None)
                data["failures"].pop(str(task), None)
                data["claims"].pop(str(task), None)
                if task not in data["pending"] and task not in data["done"]:
                    data["pending"].insert(0, task)
            return reset

    def requeue_stale(self, is_stale: Callable[[dict[str, Any]], bool]) -> list[tuple[int, dict[str, Any]]]:
        """Requeue, at the front, every claim whose holder ``is_stale``; returns them."""
        with self._locked():
            data = self._load()
            stale = [(int(k), c) for k, c in data["claims"].items() if is_stale(c)]
            if stale:
                # Reverse order keeps the lowest ID first after the front inserts.
                for task, _ in sorted(stale, reverse=True):
                    self._requeue(data, task)
                write_json_atomic(self.path, data)
            return stale


def remaining(snapshot: dict[str, Any]) -> list[int]:
    """Tasks of a snapshot not yet done (pending or claimed), in ID order."""
    done = set(snapshot["done"])
    return sorted(t for t in range(1, snapshot["analysis"] + 1) if t not in done)
