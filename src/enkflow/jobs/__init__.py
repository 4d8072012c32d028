"""The dynamic running job scheme: to-do list, pilot workers, launchers, strategies.

See ``docs/jobs.md``. Launchers live one per module (:mod:`.local`,
:mod:`.slurm`); the one-node SLURM that the tests and benchmarks start is a
harness outside the installed package (``testing/enkflow_testing/localslurm.py``).
The names below are imported on first use, so that a pilot
(``python -m enkflow.jobs``) loads only the worker's modules.
"""

from importlib import import_module

_WHERE = {
    "EventLog": "events", "iter_events": "events",
    "JobSpec": "launcher", "JobState": "launcher", "Launcher": "launcher",
    "LocalLauncher": "local", "SlurmLauncher": "slurm",
    "PlannedJob": "strategies", "Resources": "strategies", "Strategy": "strategies", "plan": "strategies",
    "Step": "tasks", "Task": "tasks", "TaskTable": "tasks",
    "Claimant": "todo", "Take": "todo", "TodoList": "todo",
    "Worker": "worker", "run_worker": "worker",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(import_module(f"enkflow.jobs.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'enkflow.jobs' has no attribute {name!r}")
