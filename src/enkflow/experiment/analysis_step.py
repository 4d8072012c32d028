"""The built-in analysis of one cycle: read the member restarts, assimilate,
update the restarts in place, write the analysis mean and spread.

``analyse_files`` does the work for any set of restart files (also used by
``enkflow bench land``); ``run_analysis`` is the experiment's analysis task.
Collective over ``comm``: run it under mpiexec for a parallel analysis; each
rank reads, analyses and writes its own row block.

Observation operator: H is the index selection of the observation file's
``state_index`` (applied rank-locally, summed across ranks), unless an
operator stage wrote H(x) per member (NetCDF files with ``hx(obs)``, see
docs/formats.md), which is then used as given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from enkflow.analysis import LESTKF, LETKF, LocalDomains
from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig
from enkflow.errors import ConfigError, FileFormatError, RecoveryError
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.io import EnsembleFiles
from enkflow.io.config import IOConfig
from enkflow.io.meanspread import write_mean_spread
from enkflow.obs import GivenHX, LinearObsOperator
from enkflow.obs.obsfile import load_for_state
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout
from enkflow.state.config import StateConfig


def read_given_hx(paths: Sequence[Path], n_obs: int) -> np.ndarray:
    """H(x) per member from an operator stage: each file holds ``hx(obs)``; returns (n_obs, N)."""
    import netCDF4

    HX = np.empty((n_obs, len(paths)))
    for m, p in enumerate(paths):
        try:
            with netCDF4.Dataset(p, "r") as ds:
                if "hx" not in ds.variables:
                    raise FileFormatError("no variable 'hx' (the operator's H(x) per observation)", path=str(p), variable="hx")
                v = np.asarray(ds.variables["hx"][:], dtype=np.float64).reshape(-1)
        except OSError as exc:
            raise FileFormatError(f"cannot read the operator output: {exc}", path=str(p), variable="hx") from None
        if v.size != n_obs:
            raise FileFormatError(f"hx has {v.size} values, the observation file {n_obs}", path=str(p), variable="hx")
        HX[:, m] = v
    return HX


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
    """
    comm = comm or get_comm()
    t0 = time.perf_counter()
    layout = StateLayout.from_config(paths[0], state)
    f = make_filter(analysis)
    metric = analysis.localization.metric if analysis.localization else None
    # Every check of the file against the state and metric (enkflow run did them before the first forecast);
    # observations sit at their state rows: same coordinates as the state points.
    of = load_for_state(obs_file, layout, metric, cycle=cycle)
    obs = of.obs
    ens = EnsembleFiles(paths, layout, mode="r+", comm=comm, config=io)
    try:
        # After the open: it finished any interrupted update, which writes the record.
        record = _applied_record(applied, cycle, comm)
        if record is not None:
            return _redo_outputs(ens, layout, record, comm, cycle, mean_path, spread_path, t0)
        start, stop = ens.row_start, ens.row_stop
        X = ens.read()
        t_read = time.perf_counter() - t0
        # Allocate the crash-safe update's log while the analysis computes.
        prep = threading.Thread(target=ens.prepare_update, daemon=True)
        prep.start()
        t1 = time.perf_counter()
        sel = LinearObsOperator.selection(of.state_index, layout.n_rows)
        op = GivenHX(read_given_hx(hx_files, obs.n_obs)) if hx_files else sel
        HX = op.apply(X, start, comm)
        omb = float(np.sqrt(np.mean((obs.values - HX.mean(axis=1)) ** 2))) if obs.n_obs else 0.0
        prior_mean = X.mean(axis=1) if truth is not None else None
        kw = {}
        if analysis.method.is_local:
            kw = {"domains": LocalDomains.by_location(layout.coords[start:stop]), "out": X}
        Xa = f.analyze(X, HX, obs, cycle=cycle, **kw)
        hxa = sel.apply(np.ascontiguousarray(Xa.mean(axis=1))[:, None], start, comm)[:, 0]
        oma = float(np.sqrt(np.mean((obs.values - hxa) ** 2))) if obs.n_obs else 0.0
        t_an = time.perf_counter() - t1
        prep.join()
        diag = {"n_obs": float(obs.n_obs), "omb_rms": omb, "oma_rms": oma}
        if isinstance(f, (LETKF, LESTKF)):
            diag.update(mean_local_obs=f.stats.mean_local_obs, search_s=f.stats.search_s, kernel_s=f.stats.kernel_s)
        if truth is not None:
            tl = truth[start:stop]
            sq = comm.allreduce_sum(np.array([np.sum((prior_mean - tl) ** 2), np.sum((Xa.mean(axis=1) - tl) ** 2)]))
            diag["rmse_prior"] = float(np.sqrt(sq[0] / layout.n_rows))
            diag["rmse_analysis"] = float(np.sqrt(sq[1] / layout.n_rows))
        t2 = time.perf_counter()
        Xa = np.asfortranarray(Xa)
        _update(ens, Xa, applied, cycle, comm, diag)
        if not ens.lossless:
            # The files round to their dtype: take the output from what they now hold, as a redo
            # after a kill (which can only read the files) would.
            ens.read(Xa)
        t_up = time.perf_counter() - t2
        t3 = time.perf_counter()
        if mean_path is not None:
            write_mean_spread(Xa, layout, mean_path, spread_path, comm=comm, title=f"enkflow analysis, cycle {cycle}")
        t_out = time.perf_counter() - t3
    finally:
        ens.close()
    return {"read_s": t_read, "analysis_s": t_an, "update_s": t_up, "output_s": t_out, **diag}


def _started_flag(applied: Path) -> Path:
    return applied.with_name(applied.name + ".started")


def _applied_record(applied: str | Path | None, cycle: int, comm: Comm) -> dict | None:
    """The completion record of an update already applied (rank 0 decides, every rank gets it)."""
    if applied is None:
        return None
    result: tuple[str, object] = ("ok", None)
    if comm.rank == 0:
        p = Path(applied)
        rec = read_json(p)
        if rec is not None:
            if int(rec.get("cycle", -1)) != cycle:
                result = ("err", RecoveryError(f"records the analysis of cycle {rec.get('cycle')}, not of cycle {cycle}", path=str(p)))
            else:
                result = ("ok", rec)
        elif _started_flag(p).exists():
            result = ("err", RecoveryError(
                f"the in-place update of cycle {cycle} was interrupted while the write-ahead log was off "
                "([io.safe_update] enabled = false): the member restarts are partly analysed and cannot be "
                "repaired; restore them from a copy of the cycle's forecast and delete this flag",
                path=str(_started_flag(p))))
    result = comm.bcast(result, root=0)
    if result[0] == "err":
        raise result[1]  # type: ignore[misc]
    return result[1]  # type: ignore[return-value]


def _update(ens: EnsembleFiles, Xa: np.ndarray, applied: str | Path | None, cycle: int, comm: Comm,
            diag: dict[str, float]) -> None:
    """Update the files in place; with ``applied``, commit the record of it with the update."""
    if applied is None:
        ens.update(Xa)
        return
    p = Path(applied)
    safe = ens.config.safe_update.enabled
    if not safe and comm.rank == 0:
        write_json_atomic(_started_flag(p), {"cycle": cycle, "t": time.time()})
    ens.update(Xa, completion={"path": str(p), "body": {"cycle": cycle, "t": time.time(), "diagnostics": diag}})
    if not safe and comm.rank == 0:
        _started_flag(p).unlink(missing_ok=True)


def _redo_outputs(ens: EnsembleFiles, layout: StateLayout, record: dict, comm: Comm, cycle: int,
                  mean_path: str | Path | None, spread_path: str | Path | None, t0: float) -> dict[str, float]:
    """A rerun after the update was applied: rewrite the outputs from the files, assimilate nothing."""
    X = ens.read()
    t_read = time.perf_counter() - t0
    t1 = time.perf_counter()
    if mean_path is not None:
        write_mean_spread(X, layout, mean_path, spread_path, comm=comm, title=f"enkflow analysis, cycle {cycle}")
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
    cdir = cfg.cycle_dir(cycle)
    cdir.mkdir(parents=True, exist_ok=True)
    return analyse_files(
        paths, cfg.obs_path(cycle), cfg.state, cfg.analysis, cfg.io, cycle=cycle,
        mean_path=cdir / "analysis_mean.nc", spread_path=cdir / "analysis_spread.nc", hx_files=hx,
        applied=cfg.applied_record(cycle),
    )
