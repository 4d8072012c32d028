"""The initial ensemble's mean and spread, written once at the start of a fresh experiment into the directory
of the cycle before the first (``cycles/0000`` for the default first cycle 1), as the same
``analysis_mean.nc`` / ``analysis_spread.nc`` as any cycle's: the report scores the initial ensemble against
the truth of that cycle (its "cycle 0")."""

from __future__ import annotations

import numpy as np

from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.directory import CycleDir
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.meanspread import STAT_BLOCK_ROWS, MeanSpreadTemplate, ensemble_mean_spread, write_mean_spread
from enkflow.parallel import Comm
from enkflow.state import StateLayout


def initial_cycle(cfg: ExperimentConfig) -> int | None:
    """The cycle whose directory holds the initial ensemble's files; None where none is written (no
    ``[state]``, ``[analysis_output] mean_spread_files = false``, or the first cycle is 0)."""
    first = cfg.experiment.first_cycle
    if cfg.state is None or not cfg.analysis_output.mean_spread_files or first < 1:
        return None
    return first - 1


# The rows of every member read at once, at most (or one STAT_BLOCK_ROWS block): blocks of a multiple of
# STAT_BLOCK_ROWS rows from row 0 give the same bits as the online server's whole-ensemble cycle 0 files.
_STREAM_BYTES = 64 << 20


def write_initial_mean_spread(cfg: ExperimentConfig, X: np.ndarray, layout: StateLayout, comm: Comm | None = None) -> None:
    """The files of the initial ensemble, this rank's rows ``X`` (n_local_rows, N) of the row blocks over
    ``comm`` (collective; rank 0 writes)."""
    cdir = _initial_dir(cfg)
    if cdir is not None:
        write_mean_spread(X, layout, cdir.mean, cdir.spread, comm=comm, title=_title(cfg))


def write_initial_from_restarts(cfg: ExperimentConfig) -> None:
    """The initial ensemble's files from the restarts the cycles advance (offline, before the first cycle, in
    the driver's one process): the mean and spread are computed from row blocks of every member streamed from
    the files (at most about 64 MiB at once), not from the whole ensemble in memory."""
    cdir = _initial_dir(cfg)
    if cdir is None or cfg.state is None:
        return
    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]
    with EnsembleFiles(paths, layout, mode="r", config=cfg.io) as ens:
        mean, spread = streamed_mean_spread(ens)
    MeanSpreadTemplate.read(layout).write(cdir.mean, cdir.spread, mean, spread, title=_title(cfg), n_ens=len(paths))


def streamed_mean_spread(ens: EnsembleFiles, max_bytes: int = _STREAM_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """The mean and spread (n_rows,) of the whole state of ``ens`` (opened by this process alone), bitwise
    those of :func:`ensemble_mean_spread` of the whole ensemble, from row blocks of every member of at most
    ``max_bytes`` (or one block of STAT_BLOCK_ROWS rows)."""
    n = ens.layout.n_rows
    rows = STAT_BLOCK_ROWS * max(1, max_bytes // (STAT_BLOCK_ROWS * 8 * ens.n_members))
    mean, spread = np.empty(n), np.empty(n)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        mean[r0:r1], spread[r0:r1] = ensemble_mean_spread(ens.read_rows(r0, r1))
    return mean, spread


def _initial_dir(cfg: ExperimentConfig) -> CycleDir | None:
    """The directory of the initial ensemble's files (created), None where none are written."""
    k = initial_cycle(cfg)
    if k is None:
        return None
    cdir = cfg.dir.cycle(k)
    cdir.path.mkdir(parents=True, exist_ok=True)
    return cdir


def _title(cfg: ExperimentConfig) -> str:
    return f"enkflow initial ensemble (cycle {initial_cycle(cfg)})"
