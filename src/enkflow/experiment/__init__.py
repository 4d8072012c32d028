"""The offline cycle driver, its configuration, checks and resume state.

``enkflow run`` and ``enkflow demo`` are built on :class:`Experiment`.
"""

from enkflow.experiment.config import ExperimentConfig, experiment_from_json, load_experiment
from enkflow.experiment.directory import CycleDir, ExperimentDir
from enkflow.experiment.driver import Experiment, build_tasks, make_launcher

__all__ = ["CycleDir", "Experiment", "ExperimentConfig", "ExperimentDir", "build_tasks", "experiment_from_json",
           "load_experiment", "make_launcher"]
