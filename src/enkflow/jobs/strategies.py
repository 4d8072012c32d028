"""How a cycle's tasks are mapped onto batch jobs.

``dynamic``     N_j pilots, each pulling IDs from the to-do list until it is
                empty; one of them runs the analysis (Zheng et al., GMD 2020).
``per-member``  one job per member, plus an analysis job that starts when
                they have all left the queue (a dependency); the usual
                hand-written workflow, for comparison.
``single``      one job holding the CPUs of all members at once, running the
                members side by side and then the analysis; the other
                reference strategy.

:func:`plan` turns the tasks still to do into job specifications; the driver
calls it at the start of a cycle and again for tasks no live job covers
(a job that died, or a resumed cycle).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path

from enkflow.jobs.launcher import JobSpec
from enkflow.jobs.tasks import logs_dir


class Strategy(str, Enum):
    DYNAMIC = "dynamic"
    PER_MEMBER = "per-member"
    SINGLE = "single"


class PilotSpan(StrEnum):
    """How long a pilot of the dynamic strategy stays (``[jobs] pilots``)."""

    CYCLE = "cycle"  # it leaves once its cycle's list is empty (Zheng et al.)
    STUDY = "study"  # it waits between cycles on the study's board (enkflow.jobs.pilot) until idle too long


class JobRole(StrEnum):
    """What a planned job is for (the ``role`` of its ``job_submit`` event)."""

    PILOT = "pilot"  # dynamic: pulls any task
    MEMBER = "member"  # per-member: one member's forecast
    ANALYSIS = "analysis"  # per-member: the analysis, after the member jobs
    ALL = "all"  # single: every task in one job


@dataclass(frozen=True)
class PlannedJob:
    """A job to submit; ``covers`` is the set of task IDs it may run (None: any)."""

    spec: JobSpec
    role: JobRole
    covers: frozenset[int] | None


@dataclass(frozen=True)
class Resources:
    """Job sizes and limits, from the ``[jobs]`` configuration.

    ``workers``: N_j pilots (dynamic); ``cpus_per_job``: CPUs of a pilot or a
    member job; ``analysis_cpus``: CPUs the analysis needs (the per-member
    strategy's analysis job; dynamic: one pilot is that large); ``time_limit_s``: wall-clock limit of every job, seconds; ``pilots``:
    how long a pilot stays, ``idle_timeout_s`` (seconds) how long one waits
    between cycles.
    """

    workers: int
    cpus_per_job: int = 1
    analysis_cpus: int = 1
    time_limit_s: float = 3600.0
    nodes: int = 1
    pilots: PilotSpan = PilotSpan.CYCLE
    idle_timeout_s: float = 120.0


def worker_argv(cycle_dir: Path, *, time_limit_s: float, threads: int = 1, only: int | None = None,
                python: str | None = None, cpus: int | None = None) -> list[str]:
    """Command line of a worker on ``cycle_dir``."""
    argv = [python or sys.executable, "-m", "enkflow.jobs", str(cycle_dir), "--time-limit", f"{time_limit_s:g}"]
    if threads != 1:
        argv += ["--threads", str(threads)]
    if cpus is not None:
        argv += ["--cpus", str(cpus)]
    if only is not None:
        argv += ["--task", str(only)]
    return argv


def pilot_argv(board: Path, *, time_limit_s: float, idle_timeout_s: float, cpus: int, threads: int = 1,
               python: str | None = None) -> list[str]:
    """Command line of a pilot that spans cycles, on the study's ``board`` (:mod:`enkflow.jobs.pilot`)."""
    return [python or sys.executable, "-m", "enkflow.jobs", "--board", str(board), "--time-limit", f"{time_limit_s:g}",
            "--idle-timeout", f"{idle_timeout_s:g}", "--cpus", str(cpus), "--threads", str(threads)]


def analysis_pilot_threads(res: Resources) -> int:
    """Member slots of the pilot that can run a parallel analysis: ``analysis_cpus`` rounded up to
    whole pilots of ``cpus_per_job`` (1 when any pilot can run it)."""
    return max(1, -(-res.analysis_cpus // res.cpus_per_job))


def plan(strategy: Strategy, *, cycle: int, cycle_dir: Path, n_members: int, todo: list[int], res: Resources,
         serial: int = 0, python: str | None = None, board: Path | None = None,
         analysis_pilot: bool = False) -> list[PlannedJob]:
    """Jobs that together can run the task IDs ``todo`` of one cycle.

    ``serial`` numbers the job names so that resubmissions are told apart.
    ``board``: where pilots that span cycles (``res.pilots`` STUDY) look for their next cycle.
    ``analysis_pilot`` (dynamic): no live pilot has the ``analysis_cpus`` a parallel analysis needs, so
    the first pilot is that large (it runs as many members side by side in the meantime).
    Member and analysis jobs of the per-member strategy are returned in
    submission order; the analysis job's ``after`` is filled in by the
    driver with the IDs the member jobs got.
    """
    analysis = n_members + 1
    members = [t for t in todo if t != analysis]
    logs = logs_dir(cycle_dir)
    jobs: list[PlannedJob] = []

    def spec(name: str, argv: list[str], cpus: int) -> JobSpec:
        # One task per CPU: `srun`/`mpiexec` inside the allocation (a parallel analysis) then gets them all.
        # No requeue: the driver replaces a job whose node failed once SLURM ends it; a job SLURM requeued
        # instead would be held for about 2 minutes while it still counts as covering the cycle's tasks.
        return JobSpec(name=f"enk{cycle}-{name}", argv=argv, cpus=cpus, time_limit_s=res.time_limit_s,
                       log=logs / f"job-{name}.log", nodes=res.nodes, ntasks=cpus, requeue=False)

    if not todo:
        return jobs
    if strategy is Strategy.DYNAMIC:
        slots = max(1, min(res.workers, len(members)))
        sizes = []
        if analysis_pilot:
            big = analysis_pilot_threads(res)
            sizes.append(big)
            slots -= big
        sizes += [1] * max(0, slots)
        for j, threads in enumerate(sizes):
            cpus = threads * res.cpus_per_job
            if res.pilots is PilotSpan.STUDY and board is not None:
                argv = pilot_argv(board, time_limit_s=res.time_limit_s, idle_timeout_s=res.idle_timeout_s, cpus=cpus,
                                  threads=threads, python=python)
            else:
                argv = worker_argv(cycle_dir, time_limit_s=res.time_limit_s, threads=threads, python=python, cpus=cpus)
            jobs.append(PlannedJob(spec(f"pilot{serial}.{j}", argv, cpus), JobRole.PILOT, None))
    elif strategy is Strategy.PER_MEMBER:
        for m in members:
            argv = worker_argv(cycle_dir, time_limit_s=res.time_limit_s, only=m, python=python)
            jobs.append(PlannedJob(spec(f"m{m}.{serial}", argv, res.cpus_per_job), JobRole.MEMBER, frozenset({m})))
        if analysis in todo:
            argv = worker_argv(cycle_dir, time_limit_s=res.time_limit_s, only=analysis, python=python)
            jobs.append(PlannedJob(spec(f"analysis.{serial}", argv, res.analysis_cpus), JobRole.ANALYSIS, frozenset({analysis})))
    elif strategy is Strategy.SINGLE:
        threads = max(1, len(members))
        cpus = max(res.cpus_per_job * threads, res.analysis_cpus)
        argv = worker_argv(cycle_dir, time_limit_s=res.time_limit_s, threads=threads, python=python)
        jobs.append(PlannedJob(spec(f"all.{serial}", argv, cpus), JobRole.ALL, None))
    return jobs
