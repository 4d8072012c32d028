"""The dynamic running job scheme: to-do list, pilot workers, launchers, strategies.

See ``docs/jobs.md``. Launchers live one per module (:mod:`.local`,
:mod:`.slurm`); :mod:`.localslurm` starts a real one-node SLURM for tests and
benchmarks.
"""

from enkflow.jobs.events import EventLog, iter_events
from enkflow.jobs.launcher import JobSpec, JobState, Launcher
from enkflow.jobs.local import LocalLauncher
from enkflow.jobs.slurm import SlurmLauncher
from enkflow.jobs.strategies import PlannedJob, Resources, Strategy, plan
from enkflow.jobs.tasks import Step, Task, TaskTable
from enkflow.jobs.todo import Claimant, Take, TodoList
from enkflow.jobs.worker import Worker, run_worker

__all__ = [
    "Claimant", "EventLog", "JobSpec", "JobState", "Launcher", "LocalLauncher", "PlannedJob", "Resources",
    "SlurmLauncher", "Step", "Strategy", "Take", "Task", "TaskTable", "TodoList", "Worker", "iter_events", "plan",
    "run_worker",
]
