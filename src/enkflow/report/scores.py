"""The typed per-cycle scores of an experiment (:mod:`enkflow.report.score_types`) from its cycle directories:
RMSE of the forecast and analysis means against a truth and the spreads per state variable, the
observation-space scores per kind (``obs_diag.nc``), QC counts and the adaptive inflation's mean factor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.experiment.directory import CycleDir
from enkflow.obs.diagnostics import QC_USED
from enkflow.progress import progress
from enkflow.report.files import cycle_dirs, has_variable, mean_variables, read_float, run_config, state_variables
from enkflow.report.score_types import CycleScores, ExperimentScores, KindScores, VariableScores

INFLATION_FILE = "inflation.nc"
QC_GROSS, QC_BUDDY = 1, 2


def truth_path(template: str, cycle: int, base: Path) -> Path:
    """The file ``template`` (with ``{cycle}``) names for ``cycle``, relative to ``base`` (the TOML's directory)."""
    p = Path(template.format(cycle=cycle)).expanduser()
    return p if p.is_absolute() else base / p


def _rmse(mean: np.ndarray | None, ref: np.ndarray | None) -> float | None:
    """RMSE of ``mean`` against ``ref`` over the points valid in both (None where either is missing)."""
    if mean is None or ref is None or mean.size != ref.size:
        return None
    d = mean.reshape(-1) - ref.reshape(-1)
    d = d[np.isfinite(d)]
    return float(np.sqrt(np.mean(d * d))) if d.size else None


def _spread(values: np.ndarray | None) -> float | None:
    """sqrt(mean over the valid points of the variance) of a spread (standard deviation) field."""
    if values is None:
        return None
    v = values[np.isfinite(values)]
    return float(np.sqrt(np.mean(v * v))) if v.size else None


def _read(path: Path, name: str) -> np.ndarray | None:
    return read_float(path, name) if path.is_file() and has_variable(path, name) else None


def _variable_scores(cdir: CycleDir, n: str, truth: Path | None, free: Path | None) -> VariableScores:
    """One variable's scores in one cycle directory (``truth``/``free``: that cycle's files or None)."""
    t = _read(truth, n) if truth is not None else None
    amean = _read(cdir.mean, n)
    fmean = _read(cdir.path / f"{n}_forecast_mean.nc", f"{n}_forecast_mean")
    return VariableScores(
        rmse_forecast=_rmse(fmean, t), rmse_analysis=_rmse(amean, t),
        rmse_free=_rmse(_read(free, n) if free is not None else None, t),
        spread_forecast=_spread(_read(cdir.path / f"{n}_forecast_spread.nc", f"{n}_forecast_spread")),
        spread_analysis=_spread(_read(cdir.spread, n)))


def _kind_names(path: Path) -> dict[int, str]:
    with netCDF4.Dataset(path) as ds:
        kv = ds.variables["kind"]
        if "flag_meanings" not in kv.ncattrs():
            return {}
        return dict(zip(np.atleast_1d(kv.flag_values).tolist(), str(kv.flag_meanings).split()))


def _mean(v: np.ndarray) -> float | None:
    return float(np.mean(v)) if v.size else None


def _rms(v: np.ndarray) -> float | None:
    return float(np.sqrt(np.mean(v * v))) if v.size else None


def _one_kind(d: dict[str, np.ndarray], sel: np.ndarray, members: int) -> KindScores:
    """The scores of the observations ``sel`` selects in one ``obs_diag.nc`` (its variables ``d``)."""
    used = sel & (d["qc"] == QC_USED)
    omb, oma = d["omb"][used], d["oma"][used]
    prior_ms, sigma_ms = _mean(d["prior_spread"][used] ** 2), _mean(d["obs_error_variance"][used])
    omb_rms = _rms(omb)
    consistency = (omb_rms / float(np.sqrt(prior_ms + sigma_ms))
                   if omb_rms is not None and prior_ms is not None and sigma_ms is not None and prior_ms + sigma_ms > 0
                   else None)
    rank = d.get("prior_rank")
    return KindScores(
        n_used=int(used.sum()), n_gross=int((sel & (d["qc"] == QC_GROSS)).sum()),
        n_buddy=int((sel & (d["qc"] == QC_BUDDY)).sum()),
        omb_bias=_mean(omb), omb_rms=omb_rms, oma_bias=_mean(oma), oma_rms=_rms(oma),
        prior_spread_ms=prior_ms, posterior_spread_ms=_mean(d["posterior_spread"][used] ** 2), sigma_o_ms=sigma_ms,
        consistency=consistency,
        crps_prior=_mean(d["prior_crps"][used]) if "prior_crps" in d else None,
        crps_posterior=_mean(d["posterior_crps"][used]) if "posterior_crps" in d else None,
        rank_hist=(np.bincount(rank[used].astype(np.int64), minlength=members + 1).astype(np.int64)
                   if rank is not None else None))


def kind_scores(path: Path, members: int) -> dict[str, KindScores]:
    """Per observation kind (by name; ``kind_C`` for a code without one) of one ``obs_diag.nc``."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        wanted = ("omb", "oma", "kind", "qc", "prior_spread", "posterior_spread", "obs_error_variance", "prior_rank",
                  "prior_crps", "posterior_crps")
        d = {k: np.asarray(ds.variables[k][:]) for k in wanted if k in ds.variables}
    names = _kind_names(path)
    return {names.get(k, f"kind_{k}"): _one_kind(d, d["kind"] == k, members) for k in np.unique(d["kind"]).tolist()}


def _cycle(k: int, cdir: CycleDir, names: list[str] | None, files: tuple[Path | None, Path | None],
           members: int) -> CycleScores:
    s = CycleScores(k)
    if cdir.mean.is_file() or cdir.spread.is_file():
        for n in mean_variables(cdir.mean if cdir.mean.is_file() else cdir.spread, names):
            s.variables[n] = _variable_scores(cdir, n, *files)
    if cdir.obs_diag.is_file():
        s.kinds = kind_scores(cdir.obs_diag, members)
    if (cdir.path / INFLATION_FILE).is_file():
        s.inflation_mean = float(np.mean(read_float(cdir.path / INFLATION_FILE, "inflation")))
    return s


def _existing(template: str | None, cycle: int, base: Path) -> Path | None:
    p = truth_path(template, cycle, base) if template else None
    return p if p is not None and p.is_file() else None


def qc_enabled(cfg: dict[str, Any]) -> bool:
    """Whether the run's ``[observations.qc]`` turns a check on (a gross-error limit or a buddy radius)."""
    qc = (cfg.get("observations") or {}).get("qc") or {}
    return qc.get("gross_sigma") is not None or qc.get("buddy_radius") is not None


def collect_scores(expdir: Path, truth: str | None = None, free_run: str | None = None) -> ExperimentScores:
    """Every cycle's scores; ``truth``/``free_run`` templates with ``{cycle}`` of files holding the state
    variables under their names (relative to the experiment TOML's directory), else the run's
    ``[verification]``. Cycle 0 (``cycles/0000``, the initial ensemble) goes to ``initial``."""
    cfg = run_config(expdir)
    ver = cfg.get("verification") or {}
    truth, free_run = truth or ver.get("truth"), free_run or ver.get("free_run")
    base = Path(cfg.get("base_dir") or expdir)
    members = int((cfg.get("experiment") or {}).get("members") or 0)
    names = state_variables(expdir)
    out = ExperimentScores(cycles=[], truth=truth, free_run=free_run, members=members or None, qc_enabled=qc_enabled(cfg))
    for k, cdir in progress(cycle_dirs(expdir), desc="report: reading cycles"):
        s = _cycle(k, cdir, names, (_existing(truth, k, base), _existing(free_run, k, base)), members)
        if k == 0:
            out.initial = s
        else:
            out.cycles.append(s)
    return out
