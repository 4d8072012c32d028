"""Pull scheduling of the members of one cycle onto runners (no sockets: pure bookkeeping).

An idle runner gets the next pending member. Every task has a due date,
``max(floor, factor x the longest forecast seen so far)`` seconds after it was
handed out; a task past its due date, or held by a runner that stopped
sending heartbeats, failed or left, goes back to the front of the queue with
a new task id. A result counts only for the member's current task id, so a
late result after a reassignment is discarded. A member whose forecast
failed ``max_failures`` times stops the study with its errors.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Set
from dataclasses import dataclass, field

from enkflow.errors import MemberError


@dataclass(frozen=True)
class SchedulerConfig:
    """Seconds: ``due_floor`` the shortest due date, ``due_factor`` times the longest forecast seen."""

    due_floor: float = 60.0
    due_factor: float = 3.0
    max_failures: int = 3


@dataclass
class Task:
    id: int
    member: int
    cycle: int
    runner: int
    t_start: float
    due: float
    parts: set[int] = field(default_factory=set)
    repeat: bool = False  # a second run of a member already done (statelessness check)


class Scheduler:
    """Members ``1..n_members`` of the current cycle; times in seconds (any monotonic clock)."""

    _ids = itertools.count(1)

    def __init__(self, n_members: int, config: SchedulerConfig = SchedulerConfig()):
        self.n = n_members
        self.cfg = config
        self.cycle = -1
        self.pending: deque[int] = deque()
        self.tasks: dict[int, Task] = {}  # in flight, by task id
        self.done: set[int] = set()
        self.failures: dict[int, list[str]] = {}
        self.longest = 0.0
        self.assigned = 0  # tasks handed out this cycle
        self.redone: dict[str, int] = {}  # reschedules this cycle, by cause
        self.probes = 0  # repeated runs of a member still to compare (the statelessness check)

    def start_cycle(self, cycle: int, done: Set[int] = frozenset(), probe: int | None = None) -> None:
        """A new cycle: every member not in ``done`` (forecasts recovered from a checkpoint) is pending.
        ``probe``: run this member twice (first and second in line); :meth:`finish` of the second run
        returns it with ``repeat`` set, for the caller to compare, then :meth:`probe_resolved`."""
        self.cycle = cycle
        self.done = set(done)
        self.pending = deque(m for m in range(1, self.n + 1) if m not in self.done)
        self.probes = 0
        if probe is not None and probe in self.pending:
            self.pending.appendleft(probe)
            self.probes = 1
        self.tasks = {}
        self.failures = {}
        self.assigned = 0
        self.redone = {}

    @property
    def complete(self) -> bool:
        return len(self.done) == self.n and self.probes == 0

    def probe_resolved(self) -> None:
        self.probes -= 1

    def due_s(self) -> float:
        return max(self.cfg.due_floor, self.cfg.due_factor * self.longest)

    def assign(self, runner: int, now: float) -> Task | None:
        """The next pending member for ``runner`` (None when none is pending)."""
        if not self.pending:
            return None
        m = self.pending.popleft()
        t = Task(next(self._ids), m, self.cycle, runner, now, now + self.due_s())
        self.tasks[t.id] = t
        self.assigned += 1
        return t

    def current(self, task_id: int, cycle: int) -> Task | None:
        """The task if it is still the one that counts for its member, else None (stale)."""
        t = self.tasks.get(task_id)
        return t if t is not None and t.cycle == cycle else None

    def finish(self, task_id: int, now: float) -> Task:
        """Record the task's forecast as the member's (call after every part arrived)."""
        t = self.tasks.pop(task_id)
        t.repeat = t.member in self.done
        self.done.add(t.member)
        self.longest = max(self.longest, now - t.t_start)
        return t

    def requeue(self, task_id: int, cause: str, error: str | None = None) -> Task | None:
        """Put the task's member back in front of the queue. With ``error`` it counts as a failure of
        the member; the ``max_failures``-th raises :class:`MemberError` with every error seen."""
        t = self.tasks.pop(task_id, None)
        if t is None:
            return None
        self.redone[cause] = self.redone.get(cause, 0) + 1
        if error is not None:
            errs = self.failures.setdefault(t.member, [])
            errs.append(error)
            if len(errs) >= self.cfg.max_failures:
                lines = "\n".join(f"  attempt {i + 1}: {e}" for i, e in enumerate(errs))
                raise MemberError(f"the forecast failed on {len(errs)} runners (online.max_failures = "
                                  f"{self.cfg.max_failures}):\n{lines}", member=t.member, cycle=t.cycle)
        self.pending.appendleft(t.member)
        return t

    def overdue(self, now: float) -> list[Task]:
        return [t for t in self.tasks.values() if now > t.due]

    def held_by(self, runner: int) -> list[Task]:
        return [t for t in self.tasks.values() if t.runner == runner]
