"""The built-in analysis of one cycle: read the member restarts, assimilate,
update the restarts in place, write the analysis mean and spread.

``analyse_files`` does the work for any set of restart files (also used by
``enkflow bench land``); ``run_analysis`` is the experiment's analysis task.
Collective over ``comm``: run it under mpiexec for a parallel analysis; each
rank reads, analyses and writes its own row block.

It is :func:`enkflow.experiment.cycling.analyse` on the member files
(:class:`~enkflow.experiment.file_store.FileStore`) and the observation file
(:class:`~enkflow.obs.space.FileObservations`: H the selection of the file's
``state_index``, or H(x) per member as an operator stage wrote it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.analysis import LocalDomains
from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig
from enkflow.errors import ConfigError
from enkflow.experiment.cycling import LocalGeometry, analyse
from enkflow.experiment.file_store import FileStore
from enkflow.io import EnsembleFiles
from enkflow.io.config import IOConfig
from enkflow.io.meanspread import write_mean_spread
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.obs.vertical import localization_coords
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout
from enkflow.state.config import StateConfig


def analyse_files(
    paths: Sequence[str | Path],
    obs_file: str | Path,
    state: StateConfig,
    analysis: AnalysisConfig,
    io: IOConfig | None = None,
    *,
    comm: Comm | None = None,
    cycle: int = 0,
    mean_path: str | Path | None = None,
    spread_path: str | Path | None = None,
    hx_files: Sequence[Path] | None = None,
    truth: np.ndarray | None = None,
    applied: str | Path | None = None,
    balance: bool | None = None,
    stats_dir: str | Path | None = None,
    stats_settings: Mapping[str, Any] | None = None,
    stats_service: str | Path | None = None,
    obs_settings: ObsSettings | None = None,
    obs_diag_dir: str | Path | None = None,
    inflation_files: tuple[Path | None, Path | None] | None = None,
) -> dict[str, float]:
    """Analyse the member files ``paths`` (member 1 first) in place with ``obs_file``.

    Returns seconds per stage (``read_s``, ``analysis_s``, ``update_s``,
    ``output_s``) and diagnostics: ``n_obs``, ``mean_local_obs``, the RMS of
    the innovation before and after (``omb_rms``, ``oma_rms``: observation minus
    background / analysis mean), and with ``truth`` (n_state,) the RMSE of the
    prior and analysis means against it. Every check (files, structure,
    observations, configuration) runs before the first byte is written.

    ``applied`` makes the analysis idempotent: the path of a JSON record that
    commits together with the in-place update (it exists if and only if the
    update was applied, also after a kill and the write-ahead log's recovery,
    see :meth:`EnsembleFiles.update`). When it exists, the files already hold
    the analysis: nothing is assimilated again; the mean/spread are written
    from the files and the recorded diagnostics are returned, with
    ``already_applied`` = 1.

    ``balance`` (local filters): see :func:`enkflow.experiment.cycling.analyse`; True analyses
    rows of equal estimated cost on every rank instead of the I/O row blocks (same result),
    False keeps the row blocks; both add the balance diagnostics (``imbalance_est``,
    ``imbalance_cpu``, ``rank_analysis_s``, ...). None: ``analysis.balance`` (default True:
    equal-cost ranges under mpiexec; one rank keeps its rows), with the balance diagnostics.

    ``stats_dir`` (the experiment's ``cycles`` directory): every rank also hands its rows of the
    forecast mean, analysis mean and spread and increment to the asynchronous output server
    (:class:`enkflow.output.analysis_output.AnalysisOutput`, started here; ``stats_settings``: its
    compression, level and writer timeout, :meth:`AnalysisOutputSection.writer_settings`), whose
    writer writes ``NNNN/VAR_STAT.nc`` while the restarts are updated; it is closed (everything
    written) before this returns. ``stats_s`` and ``stats_wait_s``: the seconds spent computing
    and adding them, and waiting for the writer at the end.
    ``stats_service``: the directory of the study's output service (:mod:`enkflow.output.service`);
    when one runs there, every rank adds its rows through it instead (no writer is started here,
    and the end waits only until the service has received them), and ``mean_path`` and
    ``spread_path`` are not written here: the service's owner (the experiment driver) writes
    them from the statistics (:class:`enkflow.output.mean_spread_files.MeanSpreadFromStatistics`).

    ``obs_diag_dir``: write the observation-space diagnostics file ``obs_diag.nc`` there
    (:mod:`enkflow.obs.diagnostics`). ``inflation_files`` (adaptive inflation): the previous
    cycle's field file (None: the configured initial value) and this cycle's, written (rank 0,
    atomically) before the update commits (:mod:`enkflow.analysis.adaptive_inflation`).
    """
    comm = comm or get_comm()
    t0 = time.perf_counter()
    layout = StateLayout.from_config(paths[0], state)
    f = make_filter(analysis)
    metric = analysis.localization.metric if analysis.localization else None
    # Every check of the file against the state, metric and observation settings (enkflow run did them before
    # the first forecast). Without settings: located by state_index, and the localization's vertical coordinate.
    obs_settings = obs_settings or ObsSettings(localization=analysis.localization)
    obs = FileObservations(load_for_state(obs_file, layout, metric, cycle=cycle, settings=obs_settings), layout.n_rows,
                           hx_files, obs_settings)
    ens = EnsembleFiles(paths, layout, mode="r+", comm=comm, config=io)
    out = None
    t_start = 0.0
    try:
        if stats_dir is not None:
            from enkflow.output.analysis_output import AnalysisOutput

            ts = time.perf_counter()
            if stats_service is not None:
                out = AnalysisOutput.through_service(layout, stats_dir, stats_service, cycle, comm,
                                                     **(stats_settings or {}))
            if out is None:
                out = AnalysisOutput(layout, stats_dir, comm, **(stats_settings or {}))
            t_start = time.perf_counter() - ts
        store = FileStore(ens, applied=applied)
        # After the open: it finished any interrupted update, which writes the record.
        record = store.applied_record(cycle)
        if out is not None and out.remote:
            # The driver writes the mean and spread files from the statistics the service writes
            # (enkflow.output.mean_spread_files): not on this task's path.
            mean_path = spread_path = None
        if record is not None:
            res = _redo_outputs(store, record, cycle, mean_path, spread_path, t0, out)
            if out is not None:
                out.close()
            return res
        infl_field, before = _adaptive_field(f, inflation_files, layout, store, comm, cycle)
        t1 = time.perf_counter()
        local = None
        if balance is None:
            # One rank has nothing to balance: its rows stay where they are (the balance is still reported).
            balance = analysis.balance and comm.size > 1
        if analysis.method.is_local:
            # With vertical localization the rows' vertical coordinate is a last column: domains per point and level.
            rc = localization_coords(layout, analysis.localization)
            if balance:  # the domains of the balanced ranges are built inside the analysis
                local = LocalGeometry(row_coords=rc)
            else:
                local = LocalGeometry(LocalDomains.by_location(rc[store.row_start:store.row_stop]), row_coords=rc)
        t_local = time.perf_counter() - t1
        diag_sink = None
        if obs_diag_dir is not None:
            from enkflow.obs.diagnostics import ObsDiagnosticsWriter

            mname = metric.value if metric is not None else ("sphere" if getattr(obs.file, "lonlat", False) else None)
            diag_sink = ObsDiagnosticsWriter(lambda _c: Path(obs_diag_dir), comm.rank, mname)
        Xa, diag = analyse(store, obs, f, cycle, local=local, truth=truth, before_update=before, balance=balance,
                           stats=out, infl_field=infl_field, obs_diag=diag_sink)
        t2 = time.perf_counter()
        if mean_path is not None:
            write_mean_spread(Xa, layout, mean_path, spread_path, comm=comm, title=f"enkflow analysis, cycle {cycle}")
        t_out = time.perf_counter() - t2
        if out is not None:
            diag["stats_remote"] = float(out.remote)
            t3 = time.perf_counter()
            out.close()
            diag["stats_wait_s"] = time.perf_counter() - t3
            diag["stats_start_s"] = t_start
            out = None
    finally:
        ens.close()
        if out is not None:  # an error: the writers are stopped, what they had not written is lost
            out.abandon()
    t_read = t1 - t0 - t_start + store.read_s
    t_an = t_local + diag.pop("analysis_s")
    return {"read_s": t_read, "analysis_s": t_an, "update_s": store.update_s, "output_s": t_out, **diag}


def _adaptive_field(f, inflation_files, layout: StateLayout, store: FileStore, comm: Comm, cycle: int):
    """``(this rank's rows of the prior inflation field or None, the before_update hook)``: with
    adaptive inflation, the field of the previous cycle's file (or the initial value), and a hook
    that writes the posterior field before the completion record commits."""
    adaptive = getattr(f, "adaptive", None)
    if adaptive is None:
        return None, store.record
    from enkflow.analysis.adaptive_inflation import read_state, write_field

    prev, new = inflation_files or (None, None)
    full = read_state(prev, layout.n_rows, adaptive.sd) if prev is not None else adaptive.initial_field(layout.n_rows)
    field = np.array(adaptive.forecast(full)[store.row_start:store.row_stop], dtype=np.float64)

    def before(Xa: np.ndarray, diag: dict[str, float]) -> None:
        if new is not None:
            allf = comm.allgather_rows(field)
            if comm.rank == 0:
                write_field(new, allf, cycle=cycle, coords=layout.coords)
            comm.barrier()
        store.record(Xa, diag)

    return field, before


def _redo_outputs(store: FileStore, record: dict, cycle: int, mean_path: str | Path | None, spread_path: str | Path | None,
                  t0: float, out=None) -> dict[str, float]:
    """A rerun after the update was applied: rewrite the outputs from the files, assimilate nothing
    (the forecast mean is gone with the update: only the analysis mean and spread statistics are redone)."""
    X = store.ens.read()
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    if out is not None:
        from enkflow.io.meanspread import ensemble_mean_spread

        amean, aspread = ensemble_mean_spread(X)
        out.add(cycle, store.row_start, {"analysis_mean": amean, "analysis_spread": aspread})
    if mean_path is not None:
        write_mean_spread(X, store.ens.layout, mean_path, spread_path, comm=store.comm, title=f"enkflow analysis, cycle {cycle}")
    diag = {k: float(v) for k, v in dict(record.get("diagnostics", {})).items()}
    return {"read_s": t_read, "analysis_s": 0.0, "update_s": 0.0, "output_s": time.perf_counter() - t1,
            **diag, "already_applied": 1.0}


def run_analysis(cfg, cycle: int, expdir: Path) -> dict[str, float]:
    """The experiment's analysis task for ``cycle`` (``cfg`` an ExperimentConfig)."""
    if cfg.state is None:
        raise ConfigError("the built-in analysis needs a [state] table (which variables form the state)", key="state")
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]
    hx = None
    if cfg.observations.operator is not None:
        hx = [cfg.operator_output(m, cycle) for m in range(1, cfg.experiment.members + 1)]
    from enkflow.output.analysis_output import service_dir

    cdir = cfg.cycle_dir(cycle)
    cdir.mkdir(parents=True, exist_ok=True)
    ao = cfg.analysis_output
    files = ao.mean_spread_files
    infl = None
    if cfg.analysis.inflation.adaptive != "none":  # carried in the cycle directories, cycle to cycle
        from enkflow.analysis.adaptive_inflation import FILE_NAME

        first = cycle <= cfg.experiment.first_cycle
        infl = (None if first else cfg.cycle_dir(cycle - 1) / FILE_NAME, cdir / FILE_NAME)
    return analyse_files(
        paths, cfg.obs_path(cycle), cfg.state, cfg.analysis, cfg.io, cycle=cycle,
        mean_path=cdir / "analysis_mean.nc" if files else None, spread_path=cdir / "analysis_spread.nc" if files else None,
        hx_files=hx, applied=cfg.applied_record(cycle), obs_settings=ObsSettings.from_experiment(cfg),
        stats_dir=cdir.parent if ao.statistics_for("offline") else None, stats_settings=ao.writer_settings(),
        stats_service=service_dir(expdir),
        obs_diag_dir=cdir, inflation_files=infl,
    )
