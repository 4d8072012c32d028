"""The dynamic running job scheme: to-do list, pilot workers, launchers, strategies.

See ``docs/jobs.md``. Launchers live one per module (:mod:`.local`,
:mod:`.slurm`), registered by ``[launcher] kind`` in :mod:`.launchers`; the one-node SLURM that the tests and benchmarks start is a
harness outside the installed package (``testing/enkflow_testing/localslurm.py``).
The names below are imported on first use, so that a pilot
(``python -m enkflow.jobs``) loads only the worker's modules.
"""

from importlib import import_module

_WHERE = {
    "EventLog": "events", "iter_events": "events",
    "JobSpec": "launcher", "JobState": "launcher", "Launcher": "launcher",
    "LAUNCHERS": "launchers", "LauncherKind": "launchers", "make_launcher": "launchers", "LauncherSection": "config",
    "LocalLauncher": "local", "SlurmLauncher": "slurm",
    "JobRole": "strategies", "PlannedJob": "strategies", "Resources": "strategies", "Strategy": "strategies",
    "plan": "strategies",
    "RestartWrite": "tasks", "Step": "tasks", "StepKind": "tasks", "Task": "tasks", "TaskTable": "tasks",
    "Unchanged": "tasks",
    "Claimant": "todo", "Take": "todo", "TodoList": "todo",
    "Worker": "worker", "run_worker": "worker",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name in _WHERE:
        return getattr(import_module(f"enkflow.jobs.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'enkflow.jobs' has no attribute {name!r}")
