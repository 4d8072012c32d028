"""How long a cycle's tasks take, as a pilot that spans cycles learns it: it does not start a task
that its time limit would cut short (:mod:`enkflow.jobs.pilot`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enkflow.jobs.files import read_json
from enkflow.jobs.tasks import Task

# A task is expected to take at most this times the longest of its kind seen so far.
DURATION_MARGIN = 1.25


@dataclass
class TaskDurations:
    """The longest run seen of each kind of task (a member's forecast, the analysis), seconds,
    from the done-markers of the cycles a pilot worked."""

    member_s: float | None = None
    analysis_s: float | None = None

    def learn(self, cycle_dir: Path) -> None:
        """What the tasks done in ``cycle_dir`` took (their done-markers' ``run_s``)."""
        for marker in (cycle_dir / "done").glob("task_*.json"):
            rec = read_json(marker, {})
            run_s = rec.get("run_s") if isinstance(rec, dict) else None
            if isinstance(run_s, (int, float)):
                self._add(rec.get("member") is None, float(run_s))

    def note(self, task: Task, run_s: float) -> None:
        """``task`` just ran for ``run_s`` seconds."""
        self._add(task.member is None, run_s)

    def _add(self, analysis: bool, run_s: float) -> None:
        if analysis:
            self.analysis_s = max(self.analysis_s or 0.0, run_s)
        else:
            self.member_s = max(self.member_s or 0.0, run_s)

    def expected(self, task: Task) -> float | None:
        """Seconds ``task`` may take: its kind's longest so far, with a margin (None: none seen yet)."""
        return self.expected_s(analysis=task.member is None)

    def expected_s(self, *, analysis: bool) -> float | None:
        """Seconds the analysis (or a member's forecast) may take, as :meth:`expected`."""
        seen = self.analysis_s if analysis else self.member_s
        return None if seen is None else DURATION_MARGIN * seen
