"""The typed scores of an experiment (:mod:`enkflow.report.score_types`) from its cycle directories: per state
variable the RMSE of the forecast, analysis and no-assimilation means against a truth and the spreads, per
observation kind the departures, consistency, CRPS and rank histogram of ``obs_diag.nc``, the QC counts and
the adaptive inflation's mean factor.

The truth and the no-assimilation reference are path templates with ``{cycle}`` of files holding the state
variables under their names, in the restart's layout (``[verification]`` in the experiment TOML).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.analysis.qc import BUDDY, GROSS
from enkflow.errors import FileFormatError
from enkflow.experiment.directory import CycleDir
from enkflow.obs.diagnostics import QC_USED
from enkflow.progress import progress
from enkflow.report.files import cycle_dirs, has_variable, read_float, run_config
from enkflow.report.score_types import CycleScores, ExperimentScores, KindScores, VariableScores

INFLATION_FILE = "inflation.nc"


def collect_scores(expdir: Path, truth: str | None = None, free_run: str | None = None) -> ExperimentScores:
    """The scores of every cycle of the experiment directory ``expdir``. ``truth``, ``free_run``: path templates
    with ``{cycle}`` (as given: relative to the working directory); None: the run's ``[verification]`` keys
    (relative to its TOML's directory), else no truth / no reference. The initial ensemble's scores
    (``initial``) are those of ``cycles/NNNN`` of the cycle before the first, where the run wrote its mean and
    spread."""
    cfg = run_config(expdir)
    truth = truth if truth is not None else _configured(cfg, "truth")
    free_run = free_run if free_run is not None else _configured(cfg, "free_run")
    names = list((cfg.get("state") or {}).get("variables") or [])
    first = int((cfg.get("experiment") or {}).get("first_cycle", 1))
    scores = ExperimentScores(cycles=[], truth=truth, free_run=free_run,
                              members=(cfg.get("experiment") or {}).get("members"), qc_enabled=_qc_enabled(cfg))
    for k, cdir in progress(cycle_dirs(expdir), desc="report: reading cycles"):
        s = CycleScores(k, variables=_variable_scores(cdir, names, k, truth, free_run))
        if k < first:
            scores.initial = s
            continue
        if cdir.obs_diag.is_file():
            s.kinds = kind_scores(cdir.obs_diag)
        if (cdir.path / INFLATION_FILE).is_file():
            s.inflation_mean = float(np.mean(read_float(cdir.path / INFLATION_FILE, "inflation")))
        scores.cycles.append(s)
    return scores


def _configured(cfg: dict[str, Any], key: str) -> str | None:
    """``[verification] key`` of the run, resolved against its TOML's directory; None where unset."""
    t = (cfg.get("verification") or {}).get(key)
    if not t:
        return None
    p = Path(t).expanduser()
    return str(p if p.is_absolute() else Path(cfg.get("base_dir", ".")) / p)


def _qc_enabled(cfg: dict[str, Any]) -> bool:
    """Whether the run (its ``config.json``) had quality control: a gross-error check (also of one kind only,
    ``[observations.kinds.NAME] qc_sigma``) or a buddy check. The one decision the page's settings and its QC
    panel follow (:attr:`ExperimentScores.qc_enabled`)."""
    obs = cfg.get("observations") or {}
    qc = obs.get("qc") or {}
    kinds = obs.get("kinds") or {}  # [observations.kinds.NAME] tables
    return (qc.get("gross_sigma") is not None or qc.get("buddy_radius") is not None
            or any(isinstance(k, dict) and k.get("qc_sigma") is not None for k in kinds.values()))


def _variable_scores(cdir: CycleDir, names: list[str], cycle: int, truth: str | None,
                     free_run: str | None) -> dict[str, VariableScores]:
    """Per state variable of the cycle's mean/spread files: RMSE of the means against the truth of ``cycle``
    (where both are known) and the spreads."""
    out = {}
    for n in names or _member_variables(cdir.mean):
        t = _field(Path(truth.format(cycle=cycle)), n) if truth else None
        free = _field(Path(free_run.format(cycle=cycle)), n) if free_run else None
        fmean, mean = _statistic(cdir, n, "forecast_mean"), _field(cdir.mean, n)
        fspread, spread = _statistic(cdir, n, "forecast_spread"), _field(cdir.spread, n)
        out[n] = VariableScores(
            rmse_forecast=_rmse(fmean, t, n), rmse_analysis=_rmse(mean, t, n), rmse_free=_rmse(free, t, n),
            spread_forecast=_spread(fspread.values if fspread else None),
            spread_analysis=_spread(spread.values if spread else None))
    return out


def _member_variables(path: Path) -> list[str]:
    """The variables of a mean/spread file with a ``member:`` cell method (a run without ``config.json``)."""
    if not path.is_file():
        return []
    with netCDF4.Dataset(path) as ds:
        return [n for n, v in ds.variables.items() if str(getattr(v, "cell_methods", "")).startswith("member:")]


@dataclass(frozen=True)
class _Field:
    """A state variable's values in one file and its dimensions (name, size), leading axes of length one (a
    time or member axis) left out: they pair no points."""

    path: Path
    values: np.ndarray
    dims: tuple[tuple[str, int], ...]


def _statistic(cdir: CycleDir, variable: str, stat: str) -> _Field | None:
    """A statistics file's values (``VARIABLE_STAT.nc``, :mod:`enkflow.output.analysis_output`), or None. Its
    dimensions carry the restart's names, or ``VARIABLE_DIM`` where two variables' ``DIM`` differ in size."""
    name = f"{variable}_{stat}"
    return _field(cdir.path / f"{name}.nc", name, prefix=f"{variable}_")


def _field(path: Path, name: str, prefix: str | None = None) -> _Field | None:
    """``name`` of ``path`` as float64, fill values NaN, or None where the file or variable is missing;
    ``prefix``: taken off the dimension names that carry it."""
    if not path.is_file() or not has_variable(path, name):
        return None
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        dims = list(zip(v.dimensions, v.shape))
    while dims and dims[0][1] == 1:
        dims.pop(0)
    if prefix:
        dims = [(d.removeprefix(prefix), k) for d, k in dims]
    return _Field(path, read_float(path, name), tuple(dims))


def _rmse(mean: _Field | None, truth: _Field | None, variable: str) -> float | None:
    """RMSE over the points valid in both, None where either is missing. The points are paired by position:
    the two must have the same dimensions (names and sizes, in order), else the truth is on another grid or in
    another order and FileFormatError names both files."""
    if mean is None or truth is None:
        return None
    if mean.dims != truth.dims:
        raise FileFormatError(f"the truth's dimensions {_dims(truth)} differ from {_dims(mean)} of {mean.path}: the "
                              "RMSE pairs points by position, so the truth must be on the state's grid, in its "
                              "dimension order", path=str(truth.path), variable=variable)
    d = mean.values.reshape(-1) - truth.values.reshape(-1)
    d = d[np.isfinite(d)]
    return float(np.sqrt(np.mean(d * d))) if d.size else None


def _dims(f: _Field) -> str:
    return "(" + ", ".join(f"{d}={k}" for d, k in f.dims) + ")"


def _spread(spread: np.ndarray | None) -> float | None:
    """sqrt(mean over the valid points of the ensemble variance)."""
    if spread is None:
        return None
    v = spread[np.isfinite(spread)]
    return float(np.sqrt(np.mean(v * v))) if v.size else None


def kind_scores(path: Path) -> dict[str, KindScores]:
    """Per observation kind (by name where the file names kinds, else the code) the scores of one ``obs_diag.nc``
    (:class:`KindScores`; without used observations only the counts)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        g = {k: np.asarray(v[:]) for k, v in ds.variables.items() if v.dimensions == ("obs",)}
        n_members = int(ds.getncattr("ensemble_size"))
        kv = ds.variables["kind"]
        names: dict[int, str] = {}
        if "flag_meanings" in kv.ncattrs():
            names = dict(zip(np.atleast_1d(kv.flag_values).tolist(), str(kv.flag_meanings).split()))
    return {names.get(k, str(k)): _one_kind(g, g["kind"] == k, n_members) for k in np.unique(g["kind"]).tolist()}


def _one_kind(g: dict[str, np.ndarray], sel: np.ndarray, n_members: int) -> KindScores:
    used = sel & (g["qc"] == QC_USED)
    counts = {"n_used": int(used.sum()), "n_gross": int((sel & (g["qc"] == GROSS)).sum()),
              "n_buddy": int((sel & (g["qc"] == BUDDY)).sum())}
    if not used.any():
        return KindScores(**counts)
    omb, oma = g["omb"][used], g["oma"][used]
    omb_rms = float(np.sqrt(np.mean(omb * omb)))
    pss, so = float(np.mean(g["prior_spread"][used] ** 2)), float(np.mean(g["obs_error_variance"][used]))
    # Files of runs before the CRPS and the rank existed lack them.
    crps = {key: float(np.mean(g[key][used])) if key in g else None for key in ("prior_crps", "posterior_crps")}
    ranks = g.get("prior_rank")
    return KindScores(
        **counts, omb_bias=float(omb.mean()), omb_rms=omb_rms, oma_bias=float(oma.mean()),
        oma_rms=float(np.sqrt(np.mean(oma * oma))), prior_spread_ms=pss,
        posterior_spread_ms=float(np.mean(g["posterior_spread"][used] ** 2)), sigma_o_ms=so,
        consistency=omb_rms / float(np.sqrt(pss + so)) if pss + so > 0 else None,
        crps_prior=crps["prior_crps"], crps_posterior=crps["posterior_crps"],
        rank_hist=None if ranks is None else np.bincount(ranks[used], minlength=n_members + 1).astype(np.int64))
