"""The built-in analysis of one cycle: read the member restarts, assimilate,
update the restarts in place, write the analysis mean and spread.

``analyse_files`` does the work for any set of restart files (also used by
``enkflow bench land``); ``run_analysis`` is the experiment's analysis task.
Collective over ``comm``: run it under mpiexec for a parallel analysis; each
rank reads, analyses and writes its own row block.

It is :func:`enkflow.experiment.step.analyse` of the step :func:`~enkflow.experiment.step.build_step`
makes, on the member files (:class:`~enkflow.experiment.file_store.FileStore`) and the
observation file (:class:`~enkflow.obs.space.FileObservations`: H the selection of the file's
``state_index``, or H(x) per member as an operator stage wrote it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.config import AnalysisConfig, ObsLayout
from enkflow.errors import ConfigError
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.cycling import OutputSink
from enkflow.experiment.file_store import FileStore
from enkflow.experiment.step import StateRows, TruthRows, analyse, build_step
from enkflow.experiment.verification import TruthFile
from enkflow.io import EnsembleFiles
from enkflow.io.config import IOConfig
from enkflow.io.meanspread import ensemble_mean_spread, write_mean_spread
from enkflow.obs.obsfile import ObsSettings
from enkflow.obs.distributed_space import SharedFileObservations
from enkflow.obs.source import ObsFileSource
from enkflow.obs.space import FileObservations
from enkflow.output.analysis_output import AnalysisOutput
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout
from enkflow.state.config import StateConfig


@dataclass(frozen=True)
class AnalysisFiles:
    """What an offline analysis writes besides the member files (None: not written).

    ``cycle_dir(cycle)``: the directory of each cycle's ``obs_diag.nc`` and adaptive inflation
    field (the previous cycle's is read, after ``first_cycle``); ``mean`` and ``spread``: the
    analysis mean and spread files; ``applied``: the completion record that commits together with
    the update in place (it makes the analysis idempotent, see :func:`analyse_files`).

    ``stats_dir`` (the experiment's ``cycles`` directory): every rank also hands its rows of the
    forecast mean, analysis mean and spread and increment to the asynchronous output server
    (:class:`enkflow.output.analysis_output.AnalysisOutput`; ``stats_settings``: its compression,
    level and writer timeout, :meth:`AnalysisOutputSection.writer_settings`), whose writer writes
    ``NNNN/VAR_STAT.nc`` while the restarts are updated. ``stats_service``: the directory of the
    study's output service (:mod:`enkflow.output.service`); when one runs there, every rank adds
    its rows through it instead, and ``mean`` and ``spread`` are not written here: the service's
    owner (the experiment driver) writes them from the statistics."""

    cycle_dir: Callable[[int], Path] | None = None
    first_cycle: int = 0
    mean: Path | None = None
    spread: Path | None = None
    applied: Path | None = None
    stats_dir: Path | None = None
    stats_settings: Mapping[str, Any] = field(default_factory=dict)
    stats_service: Path | None = None


class MeanSpreadFiles(OutputSink):
    """The offline output sink: the analysis mean and spread files of the cycle
    (:func:`enkflow.io.meanspread.write_mean_spread`, collective); ``write_s`` its seconds."""

    def __init__(self, layout: StateLayout, mean: Path, spread: Path | None, comm: Comm):
        self.layout, self.mean, self.spread, self.comm = layout, mean, spread, comm
        self.write_s = 0.0

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics | None = None) -> None:
        t0 = time.perf_counter()
        write_mean_spread(Xa, self.layout, self.mean, self.spread, comm=self.comm,
                          title=f"enkflow analysis, cycle {cycle}")
        self.write_s = time.perf_counter() - t0


def _observations(path: str | Path, layout: StateLayout, settings: ObsSettings, analysis: AnalysisConfig, cycle: int,
                  hx_files: Sequence[Path] | None, comm: Comm) -> FileObservations | SharedFileObservations:
    """The cycle's observations read and checked: each rank its share where a local filter keeps them
    distributed (``[analysis] observations``), else whole on every rank."""
    if analysis.observations is ObsLayout.DISTRIBUTED and analysis.method.is_local:
        source = ObsFileSource(Path(path), layout, settings, cycle, tuple(hx_files) if hx_files else None)
        return SharedFileObservations(source, comm)
    return FileObservations.load(path, layout, settings, cycle, hx_files)


def analyse_files(
    paths: Sequence[str | Path],
    obs_file: str | Path,
    state: StateConfig,
    analysis: AnalysisConfig,
    io: IOConfig | None = None,
    *,
    comm: Comm | None = None,
    cycle: int = 0,
    files: AnalysisFiles = AnalysisFiles(),
    hx_files: Sequence[Path] | None = None,
    obs_settings: ObsSettings | None = None,
    truth: TruthRows | None = None,
    balance: bool | None = None,
) -> dict[str, float | list[float]]:
    """Analyse the member files ``paths`` (member 1 first) in place with ``obs_file``.

    Returns seconds per stage (``read_s``, ``analysis_s``, ``update_s``, ``output_s``) and the
    diagnostics of :class:`~enkflow.experiment.cycle_diagnostics.CycleDiagnostics` (with ``truth``
    (n_state,) the RMSE of the prior and analysis means against it). Every check (files,
    structure, observations, configuration) runs before the first byte is written. ``hx_files``:
    H(x) of each member from an operator stage; ``obs_settings``: the ``[observations]`` keys.

    With ``files.applied`` the analysis is idempotent: the record commits together with the
    in-place update (it exists if and only if the update was applied, also after a kill and the
    write-ahead log's recovery, see :meth:`EnsembleFiles.update`). When it exists, the files
    already hold the analysis: nothing is assimilated again; the mean/spread are written from the
    files and the recorded diagnostics are returned, with ``already_applied`` = 1.

    ``balance`` (local filters): see :func:`~enkflow.experiment.step.build_step`; the balance is
    reported either way. Statistics (``files.stats_dir``) are closed (written) before this returns:
    ``stats_s`` and ``stats_wait_s`` are the seconds spent adding them and waiting for the writer."""
    comm = comm or get_comm()
    t0 = time.perf_counter()
    layout = StateLayout.from_config(paths[0], state)
    # Every check of the file against the state, metric and observation settings (enkflow run did them before
    # the first forecast). Without settings: located by state_index, and the localization's vertical coordinate.
    obs = _observations(obs_file, layout, obs_settings or ObsSettings(localization=analysis.localization), analysis,
                        cycle, hx_files, comm)
    ens = EnsembleFiles(paths, layout, mode="r+", comm=comm, config=io)
    stats = None
    try:
        ts = time.perf_counter()
        stats = _statistics(files, layout, cycle, comm)
        t_start = time.perf_counter() - ts
        store = FileStore(ens, applied=files.applied)
        record = store.applied_record(cycle)  # after the open, which finished any interrupted update
        # With the output service the driver writes the mean and spread files from the statistics
        # (enkflow.output.mean_spread_files): not on this task's path.
        mean_spread = (MeanSpreadFiles(layout, files.mean, files.spread, comm)
                       if files.mean is not None and not (stats is not None and stats.remote) else None)
        if record is not None:
            redone = _redo_outputs(store, record, cycle, mean_spread, t0, stats)
            if stats is not None:
                stats.close()
                stats = None  # closed: nothing left to abandon
            return redone
        t1 = time.perf_counter()
        step = build_step(analysis, StateRows.of_layout(layout), comm, cycle_dir=files.cycle_dir,
                          first_cycle=files.first_cycle, stats=stats, output=mean_spread,
                          truth=None if truth is None else lambda _c: truth, balance=balance)
        t_step = time.perf_counter() - t1
        _, diag = analyse(step, store, obs, cycle)
        res: dict[str, float | list[float]] = {k: v for k, v in diag.as_dict().items() if k != "analysis_s"}
        if stats is not None:
            res |= _close_statistics(stats, t_start)
            stats = None
    finally:
        ens.close()
        if stats is not None:  # an error: the writers are stopped, what they had not written is lost
            stats.abandon()
    t_read = t1 - t0 - t_start + store.read_s
    t_out = mean_spread.write_s if mean_spread is not None else 0.0
    return {"read_s": t_read, "analysis_s": t_step + diag.analysis_s, "update_s": store.update_s, "output_s": t_out,
            **res}


def _statistics(files: AnalysisFiles, layout: StateLayout, cycle: int, comm: Comm) -> AnalysisOutput | None:
    """The statistics sink of ``files`` (collective): through the study's output service where one
    runs, else a writer of its own; None without ``files.stats_dir``."""
    if files.stats_dir is None:
        return None
    out = None
    if files.stats_service is not None:
        out = AnalysisOutput.through_service(layout, files.stats_dir, files.stats_service, cycle, comm,
                                             **files.stats_settings)
    return out or AnalysisOutput(layout, files.stats_dir, comm, **files.stats_settings)


def _close_statistics(stats: AnalysisOutput, t_start: float) -> dict[str, float]:
    """Close the statistics sink (everything written, or received by the service); its figures."""
    t0 = time.perf_counter()
    stats.close()
    return {"stats_remote": float(stats.remote), "stats_wait_s": time.perf_counter() - t0, "stats_start_s": t_start}


def _redo_outputs(store: FileStore, record: dict, cycle: int, mean_spread: MeanSpreadFiles | None, t0: float,
                  stats: AnalysisOutput | None) -> dict[str, float | list[float]]:
    """A rerun after the update was applied: rewrite the outputs from the files, assimilate nothing
    (the forecast mean is gone with the update: only the analysis mean and spread statistics are redone)."""
    X = store.ens.read()
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    if stats is not None:
        amean, aspread = ensemble_mean_spread(X)
        stats.add(cycle, store.row_start, {"analysis_mean": amean, "analysis_spread": aspread})
    if mean_spread is not None:
        mean_spread.write(cycle, X, store.row_start)
    diag = {k: float(v) for k, v in dict(record.get("diagnostics", {})).items()}
    return {"read_s": t_read, "analysis_s": 0.0, "update_s": 0.0, "output_s": time.perf_counter() - t1,
            **diag, "already_applied": 1.0}


def run_analysis(cfg: ExperimentConfig, cycle: int) -> dict[str, float | list[float]]:
    """The experiment's analysis task for ``cycle``."""
    if cfg.state is None:
        raise ConfigError("the built-in analysis needs a [state] table (which variables form the state)", key="state")
    members = range(1, cfg.experiment.members + 1)
    hx = [cfg.operator_output(m, cycle) for m in members] if cfg.observations.operator is not None else None
    expdir = cfg.dir
    cdir = expdir.cycle(cycle)
    cdir.path.mkdir(parents=True, exist_ok=True)
    ao = cfg.analysis_output
    ms = ao.mean_spread_files
    files = AnalysisFiles(  # cycle_dir: obs_diag.nc; the inflation field, cycle to cycle
        cycle_dir=lambda c: expdir.cycle(c).path, first_cycle=cfg.experiment.first_cycle,
        mean=cdir.mean if ms else None, spread=cdir.spread if ms else None,
        applied=cdir.applied, stats_dir=expdir.cycles if ao.statistics_for("offline") else None,
        stats_settings=ao.writer_settings(), stats_service=expdir.output_service)
    tp = cfg.truth_path(cycle)
    truth = None if tp is None else TruthFile(tp, StateLayout.from_config(cfg.restart_path(1), cfg.state))
    return analyse_files([cfg.restart_path(m) for m in members], cfg.obs_path(cycle), cfg.state, cfg.analysis, cfg.io,
                         cycle=cycle, files=files, hx_files=hx, obs_settings=ObsSettings.from_experiment(cfg),
                         truth=truth)
