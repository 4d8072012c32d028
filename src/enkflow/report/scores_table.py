"""The experiment's scores as tables that xarray and pandas read: ``EXPDIR/scores.nc`` and ``EXPDIR/scores.csv``.

``scores.nc`` (CF): per state variable ``VARIABLE_METRIC(cycle, variable)`` of :class:`VariableScores`, per
observation kind ``KIND_METRIC(cycle, kind)`` of :class:`KindScores`, ``rank_hist(cycle, kind, rank)``,
``inflation_mean(cycle)``; NaN (``_FillValue`` -1 for the counts) where a score is unknown. The initial
ensemble's row, where written, is its cycle (the one before the first).

``scores.csv`` (tidy, long): ``cycle,scope,name,metric,value`` with scope ``variable`` (name: the state
variable), ``kind`` (name: the observation kind; rank histogram counts as metrics ``rank_hist_R``) or
``cycle`` (name ``all``: the inflation's mean); unknown scores are left out.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.fsutil import atomic_output
from enkflow.report.score_types import CycleScores, ExperimentScores, KindScores, VariableScores

NC_FILE, CSV_FILE = "scores.nc", "scores.csv"
_COUNTS = ("n_used", "n_gross", "n_buddy")
_VAR_METRICS = tuple(f.name for f in fields(VariableScores))
_KIND_METRICS = tuple(f.name for f in fields(KindScores) if f.name != "rank_hist")
_DESCRIPTION = {
    "rmse_forecast": "RMSE of the forecast ensemble mean against the truth",
    "rmse_analysis": "RMSE of the analysis ensemble mean against the truth",
    "rmse_free": "RMSE of the no-assimilation reference against the truth",
    "spread_forecast": "forecast ensemble spread, sqrt(mean variance)",
    "spread_analysis": "analysis ensemble spread, sqrt(mean variance)",
    "n_used": "observations used", "n_gross": "observations rejected by the gross-error check",
    "n_buddy": "observations rejected by the buddy check",
    "omb_bias": "mean observation minus background", "omb_rms": "RMS of observation minus background",
    "oma_bias": "mean observation minus analysis", "oma_rms": "RMS of observation minus analysis",
    "prior_spread_ms": "mean prior H(x) ensemble variance", "posterior_spread_ms": "mean posterior H(x) ensemble variance",
    "sigma_o_ms": "mean observation error variance",
    "consistency": "omb_rms / sqrt(prior_spread_ms + sigma_o_ms)",
    "crps_prior": "mean CRPS of the prior H(x) ensemble", "crps_posterior": "mean CRPS of the posterior H(x) ensemble",
}


def _rows(scores: ExperimentScores) -> list[CycleScores]:
    return ([scores.initial] if scores.initial is not None else []) + list(scores.cycles)


def write_scores_table(scores: ExperimentScores, expdir: Path) -> tuple[Path, Path]:
    """Write ``scores.nc`` and ``scores.csv`` into ``expdir``, each atomically; their paths."""
    nc, cs = Path(expdir) / NC_FILE, Path(expdir) / CSV_FILE
    with atomic_output(nc) as tmp:
        _write_netcdf(tmp, scores)
    with atomic_output(cs) as tmp:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(("cycle", "scope", "name", "metric", "value"))
            w.writerows(tidy_rows(scores))
    return nc, cs


def tidy_rows(scores: ExperimentScores) -> Iterator[tuple[int, str, str, str, float | int]]:
    """``(cycle, scope, name, metric, value)`` of every known score."""
    for c in _rows(scores):
        for name, v in c.variables.items():
            for m in _VAR_METRICS:
                if (x := getattr(v, m)) is not None:
                    yield c.cycle, "variable", name, m, x
        for name, k in c.kinds.items():
            for m in _KIND_METRICS:
                if (x := getattr(k, m)) is not None:
                    yield c.cycle, "kind", name, m, x
            for r, n in enumerate([] if k.rank_hist is None else k.rank_hist.tolist()):
                yield c.cycle, "kind", name, f"rank_hist_{r}", n
        if c.inflation_mean is not None:
            yield c.cycle, "cycle", "all", "inflation_mean", c.inflation_mean


def _write_netcdf(path: Path, scores: ExperimentScores) -> None:
    rows = _rows(scores)
    variables = sorted({n for c in rows for n in c.variables})
    kinds = sorted({n for c in rows for n in c.kinds})
    n_rank = max((k.rank_hist.size for c in rows for k in c.kinds.values() if k.rank_hist is not None), default=0)
    ds = netCDF4.Dataset(path, "w", format="NETCDF4")
    try:
        ds.setncatts({"Conventions": "CF-1.8", "title": "enkflow per-cycle scores", "source": "enkflow",
                      "truth": scores.truth or "", "free_run": scores.free_run or "",
                      "ensemble_size": np.int32(scores.members or 0), "qc_enabled": np.int8(scores.qc_enabled),
                      "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow write_scores_table"})
        cv = _coordinate(ds, "cycle", "i4", np.array([c.cycle for c in rows], dtype=np.int32))
        cv.long_name = "assimilation cycle" + (" (the first row: the initial ensemble)" if scores.initial else "")
        _coordinate(ds, "variable", str, variables).long_name = "state variable"
        _coordinate(ds, "kind", str, kinds).long_name = "observation kind"
        for m in _VAR_METRICS:
            _metric(ds, m, ("cycle", "variable"), [[getattr(c.variables[n], m) if n in c.variables else None
                                                     for n in variables] for c in rows])
        for m in _KIND_METRICS:
            _metric(ds, m, ("cycle", "kind"), [[getattr(c.kinds[n], m) if n in c.kinds else None
                                                 for n in kinds] for c in rows])
        _metric(ds, "inflation_mean", ("cycle",), [c.inflation_mean for c in rows]).long_name = \
            "mean adaptive inflation factor"
        if n_rank:
            _coordinate(ds, "rank", "i4", np.arange(n_rank, dtype=np.int32)).long_name = "rank of y in the prior"
            hist = np.full((len(rows), len(kinds), n_rank), -1, dtype=np.int64)
            for i, c in enumerate(rows):
                for j, n in enumerate(kinds):
                    if n in c.kinds and c.kinds[n].rank_hist is not None:
                        hist[i, j, :] = c.kinds[n].rank_hist
            v = ds.createVariable("rank_hist", "i8", ("cycle", "kind", "rank"), fill_value=np.int64(-1))
            v.long_name = "rank histogram of the used observations in the perturbed prior H(x) (obs_diag.nc prior_rank)"
            v.units = "1"
            v[:] = hist
    finally:
        ds.close()


def _coordinate(ds: netCDF4.Dataset, name: str, dtype: type | str, values) -> netCDF4.Variable:
    ds.createDimension(name, len(values))
    v = ds.createVariable(name, dtype, (name,))
    for i, x in enumerate(values):
        v[i] = x
    return v


def _metric(ds: netCDF4.Dataset, name: str, dims: tuple[str, ...], values: list) -> netCDF4.Variable:
    """A score variable; None becomes NaN (the counts: -1, their _FillValue)."""
    count = name in _COUNTS
    a = np.array([[np.nan if x is None else x for x in r] for r in values] if len(dims) > 1 else
                 [np.nan if x is None else x for x in values], dtype=np.float64)
    if count:
        a = np.where(np.isnan(a), -1, a).astype(np.int64)
    v = ds.createVariable(name, "i8" if count else "f8", dims, fill_value=np.int64(-1) if count else np.nan)
    v.long_name = _DESCRIPTION.get(name, name)
    if count:
        v.units = "1"
    else:  # the units differ along the variable or kind dimension
        v.comment = "in the state variable's or the observation kind's units (squared for the _ms means)"
    v[:] = a.reshape([len(ds.dimensions[d]) for d in dims])
    return v
