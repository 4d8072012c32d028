"""What every launcher offers: submit a job, ask its state, cancel it.

One launcher per module: :mod:`enkflow.jobs.local` (processes on this
machine) and :mod:`enkflow.jobs.slurm` (``sbatch``/``squeue``/``scancel``),
registered by kind in :mod:`enkflow.jobs.launchers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol, Sequence


class JobState(str, Enum):
    PENDING = "pending"  # waiting in the queue (or for a dependency)
    RUNNING = "running"
    FINISHED = "finished"  # left the queue, whatever its exit status; the to-do list tells what it did


@dataclass(frozen=True)
class JobSpec:
    """A batch job: one command on ``cpus`` CPUs for at most ``time_limit_s`` seconds.

    ``after`` lists job IDs that must have finished (any exit status) before
    this job may start. ``nodes`` and ``ntasks`` matter to SLURM only (a
    multi-task analysis launched with ``srun`` or ``mpiexec`` inside the job),
    as does ``requeue``: False when the caller replaces a job whose node failed
    itself, at once and with its current arguments (SLURM would start the same
    command again, after a delay).
    """

    name: str
    argv: list[str]
    cpus: int = 1
    time_limit_s: float = 3600.0
    log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    after: Sequence[str] = ()
    nodes: int = 1
    ntasks: int = 1
    requeue: bool = True


class Launcher(Protocol):
    """The small interface the experiment driver uses; job IDs are strings."""

    name: str

    def submit(self, spec: JobSpec) -> str:
        """Queue ``spec``; returns its job ID."""
        ...

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """Current state of each job; unknown IDs are FINISHED."""
        ...

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Remove pending jobs and stop running ones (SIGTERM first); unknown IDs are ignored."""
        ...

    def exit_status(self, job_id: str) -> int | None:
        """A finished job's exit status: its code, or -N when signal N ended it; None while it runs, or
        where the batch system does not say (no accounting)."""
        ...

    def close(self) -> None:
        """Release what the launcher holds (nothing is cancelled)."""
        ...
