"""The initial ensemble's mean and spread, written once at the start of a fresh experiment into the directory
of the cycle before the first (``cycles/0000`` for the default first cycle 1), as the same
``analysis_mean.nc`` / ``analysis_spread.nc`` as any cycle's: the report scores the initial ensemble against
the truth of that cycle (its "cycle 0")."""

from __future__ import annotations

import numpy as np

from enkflow.experiment.config import ExperimentConfig
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.meanspread import write_mean_spread
from enkflow.parallel import Comm
from enkflow.state import StateLayout


def initial_cycle(cfg: ExperimentConfig) -> int | None:
    """The cycle whose directory holds the initial ensemble's files; None where none is written (no
    ``[state]``, ``[analysis_output] mean_spread_files = false``, or the first cycle is 0)."""
    first = cfg.experiment.first_cycle
    if cfg.state is None or not cfg.analysis_output.mean_spread_files or first < 1:
        return None
    return first - 1


def write_initial_mean_spread(cfg: ExperimentConfig, X: np.ndarray, layout: StateLayout, comm: Comm | None = None) -> None:
    """The files of the initial ensemble, this rank's rows ``X`` (n_local_rows, N) of the row blocks over
    ``comm`` (collective; rank 0 writes)."""
    k = initial_cycle(cfg)
    if k is None:
        return
    cdir = cfg.dir.cycle(k)
    cdir.path.mkdir(parents=True, exist_ok=True)
    write_mean_spread(X, layout, cdir.mean, cdir.spread, comm=comm, title=f"enkflow initial ensemble (cycle {k})")


def write_initial_from_restarts(cfg: ExperimentConfig) -> None:
    """The initial ensemble's files from the restarts the cycles advance (offline, before the first cycle)."""
    if initial_cycle(cfg) is None or cfg.state is None:
        return
    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]
    with EnsembleFiles(paths, layout, mode="r", config=cfg.io) as ens:
        X = ens.read()
    write_initial_mean_spread(cfg, X, layout)
