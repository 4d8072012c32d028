"""The task table of a cycle (``tasks.json``): what each to-do ID runs.

The experiment driver writes it once per cycle; workers only read it, so the
job layer knows commands, not experiment configuration. Schema::

    {"cycle": k, "n_members": N, "events": "/abs/events.jsonl",
     "max_attempts": 3, "heartbeat_s": 2.0, "lease_s": 15.0, "poll_s": 0.2,
     "env": {"VAR": "value"},
     "tasks": {"1": {"member": 1, "restart": "/abs/member_001.nc",
                     "restart_write": "in-place" | "rename", "unchanged": "warn" | "error",
                     "steps": [{"name": "model", "argv": [...],
                                "commit": {"from": "/abs/tmp", "to": "/abs/final"} | null}]},
               ...,
               "N+1": {"member": null, "steps": [{"name": "analysis", "argv": [...]}]}}}

A member's ``restart`` is kept aside before its first run in the cycle and
restored before every rerun (:mod:`enkflow.jobs.protect`), so a forecast is
applied exactly once whatever was killed when. ``commit`` renames the step's
output over its destination after a zero exit (a model writing ``{output}``);
the output must then exist. ``unchanged`` says what a model that exits 0 but
leaves its restart untouched gets: a warning event or a failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from enkflow.errors import EnkflowError
from enkflow.jobs.files import read_json, write_json_atomic

TASKS_FILE = "tasks.json"


def done_marker(cycle_dir: Path, task: int) -> Path:
    """The marker a worker writes (atomically) once ``task`` of the cycle is confirmed done."""
    return cycle_dir / "done" / f"task_{task:03d}.json"


def logs_dir(cycle_dir: Path) -> Path:
    """The cycle's logs: the jobs' and each task attempt's."""
    return cycle_dir / "logs"


class StepKind(StrEnum):
    """What a step runs (its ``name`` in ``tasks.json``)."""

    MODEL = "model"  # a member's forecast: advances its restart
    OPERATOR = "operator"  # H(x) of a member's forecast
    ANALYSIS = "analysis"


class RestartWrite(StrEnum):
    """``model.restart_write``: how the model writes its restart (:mod:`enkflow.jobs.protect`)."""

    IN_PLACE = "in-place"  # it may rewrite the file: a copy is kept aside
    RENAME = "rename"  # it renames a finished file over it: a hard link is kept


class Unchanged(StrEnum):
    """``model.unchanged``: what a model that exits 0 but leaves its restart untouched gets."""

    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True)
class Step:
    """One command of a task. ``argv`` is run without a shell."""

    name: StepKind
    argv: list[str]
    commit: dict[str, str] | None = None
    fatal_rc: int | None = None  # exit status meaning a deterministic error: never retried

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name.value, "argv": list(self.argv), "commit": self.commit, "fatal_rc": self.fatal_rc}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Step":
        return cls(StepKind(d["name"]), list(d["argv"]), d.get("commit"), d.get("fatal_rc"))


@dataclass(frozen=True)
class Task:
    """A to-do ID's work: a member forecast (``member`` set) or the analysis."""

    id: int
    member: int | None
    steps: list[Step]
    restart: str | None = None  # the member restart the model advances (protected copy, unchanged check)
    restart_write: RestartWrite = RestartWrite.IN_PLACE  # how the model writes it (protect.py)
    unchanged: Unchanged = Unchanged.WARN  # what a zero exit that left the restart untouched gets
    max_attempts: int | None = None  # overrides the table's limit (the analysis has its own)
    cpus: int = 1  # CPUs it needs: a pilot with fewer does not take it (a parallel analysis)

    @property
    def label(self) -> str:
        return f"member {self.member}" if self.member is not None else "analysis"

    def to_json(self) -> dict[str, Any]:
        return {
            "member": self.member,
            "steps": [s.to_json() for s in self.steps],
            "restart": self.restart,
            "restart_write": self.restart_write.value,
            "unchanged": self.unchanged.value,
            "max_attempts": self.max_attempts,
            "cpus": self.cpus,
        }

    @classmethod
    def from_json(cls, tid: int, d: dict[str, Any]) -> "Task":
        return cls(tid, d.get("member"), [Step.from_json(s) for s in d["steps"]], d.get("restart"),
                   RestartWrite(d.get("restart_write", RestartWrite.IN_PLACE)), Unchanged(d.get("unchanged", Unchanged.WARN)),
                   d.get("max_attempts"), int(d.get("cpus", 1)))


@dataclass(frozen=True)
class TaskTable:
    """Everything a worker needs to run any task of one cycle."""

    cycle: int
    n_members: int
    tasks: dict[int, Task]
    events: str
    max_attempts: int = 3
    heartbeat_s: float = 2.0
    lease_s: float = 15.0
    poll_s: float = 0.2
    env: dict[str, str] = field(default_factory=dict)

    @property
    def analysis(self) -> int:
        return self.n_members + 1

    def write(self, directory: str | os.PathLike[str]) -> None:
        """Write ``directory/tasks.json`` atomically."""
        write_json_atomic(
            Path(directory) / TASKS_FILE,
            {
                "cycle": self.cycle,
                "n_members": self.n_members,
                "events": self.events,
                "max_attempts": self.max_attempts,
                "heartbeat_s": self.heartbeat_s,
                "lease_s": self.lease_s,
                "poll_s": self.poll_s,
                "env": self.env,
                "tasks": {str(k): t.to_json() for k, t in self.tasks.items()},
            },
        )

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> "TaskTable":
        """Read ``directory/tasks.json``."""
        d = read_json(Path(directory) / TASKS_FILE)
        if d is None:
            raise EnkflowError(f"{directory}: no tasks.json; is this a cycle directory of an enkflow experiment?")
        return cls(
            cycle=int(d["cycle"]),
            n_members=int(d["n_members"]),
            tasks={int(k): Task.from_json(int(k), v) for k, v in d["tasks"].items()},
            events=d["events"],
            max_attempts=int(d["max_attempts"]),
            heartbeat_s=float(d["heartbeat_s"]),
            lease_s=float(d["lease_s"]),
            poll_s=float(d["poll_s"]),
            env=dict(d.get("env", {})),
        )
