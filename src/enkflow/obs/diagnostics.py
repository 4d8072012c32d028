"""The observation-space diagnostics file of one cycle (the analogue of DART's ``obs_seq.final``).

One CF NetCDF-4 file per cycle, ``obs_diag.nc`` in the cycle directory, with one entry per
observation of the cycle's file (QC-rejected ones included, flagged): the value, its error
variance, kind, coordinates, the prior (forecast) and posterior (analysis) ensemble mean and
spread of H(x), the departures OmB = y - mean H(x^f) and OmA = y - mean H(x^a), and the QC flag.
``featureType = "point"``; readable with ``xarray.open_dataset``.

Spreads are ensemble standard deviations (ddof = 1). The posterior H(x) is H applied to every
analysis member (so its mean equals H of the analysis mean for a linear H). Per observation also the
ensemble CRPS of the prior and posterior H(x) against y, and the rank of y in the prior H(x) perturbed
with the observation error (:mod:`enkflow.obs.ensemble_scores`; its histogram over the used observations
is the rank histogram).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.config import Metric
from enkflow.fsutil import atomic_output
from enkflow.obs.ensemble_scores import RANK_METHOD, ensemble_crps, prior_ranks

FILE_NAME = "obs_diag.nc"
QC_USED = 0
QC_MEANINGS = "used rejected_gross_error rejected_buddy_check"

# Coordinate variable names and CF attributes, by localization metric.
_COORDS = {
    "sphere": (("lon", {"standard_name": "longitude", "units": "degrees_east"}),
               ("lat", {"standard_name": "latitude", "units": "degrees_north"})),
    "cartesian": (("x", {"long_name": "x coordinate", "units": "1"}), ("y", {"long_name": "y coordinate", "units": "1"}),
                  ("z", {"long_name": "z coordinate", "units": "1"})),
    "periodic": (("index", {"long_name": "position on the periodic ring", "units": "1"}),),
}


@dataclass(frozen=True)
class ObsSpaceStats:
    """Per-observation statistics, all (n_obs,): float64, ``prior_rank`` int32 in 0..N."""

    prior_mean: np.ndarray
    prior_spread: np.ndarray
    posterior_mean: np.ndarray
    posterior_spread: np.ndarray
    prior_crps: np.ndarray
    posterior_crps: np.ndarray
    prior_rank: np.ndarray

    @classmethod
    def from_ensembles(cls, HX: np.ndarray, HXa: np.ndarray, y: ObsSet, cycle: int) -> "ObsSpaceStats":
        """From H(x) of the forecast and the analysis ensembles, (n_obs, N) each, and the observations ``y``
        of ``cycle`` (which seeds the rank's perturbations)."""
        def ms(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            sd = A.std(axis=1, ddof=1) if A.shape[1] > 1 else np.zeros(A.shape[0])
            return A.mean(axis=1), sd

        HX, HXa = np.asarray(HX, dtype=np.float64), np.asarray(HXa, dtype=np.float64)
        pm, ps = ms(HX)
        am, as_ = ms(HXa)
        return cls(pm, ps, am, as_, ensemble_crps(HX, y.values), ensemble_crps(HXa, y.values),
                   prior_ranks(HX, y.values, y.error_var, cycle))


def write_obs_diagnostics(
    path: str | os.PathLike[str],
    y: ObsSet,
    stats: ObsSpaceStats,
    *,
    cycle: int,
    n_members: int,
    qc_flags: np.ndarray | None = None,
    metric: str | None = None,
    kind_names: dict[int, str] | None = None,
) -> None:
    """Write the diagnostics of ``y`` (all the cycle's observations) atomically to ``path``.

    ``qc_flags`` (n_obs,) int: 0 used, 1 rejected by the gross-error check, 2 by the buddy check
    (None: all used). ``metric`` names the coordinates (sphere: lon/lat, cartesian: x/y/z,
    periodic: index; None: coord_1, coord_2, ...). ``kind_names`` maps kind codes to names.
    """
    n = y.n_obs
    flags = np.zeros(n, np.int8) if qc_flags is None else np.asarray(qc_flags, dtype=np.int8).reshape(-1)
    if flags.shape != (n,):
        raise ValueError(f"qc_flags has shape {flags.shape}, expected ({n},)")
    names = _COORDS.get(metric or "", ())
    with atomic_output(Path(path)) as tmp:
        ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            ds.createDimension("obs", n)
            ov = ds.createVariable("obs", "i4", ("obs",))
            ov.long_name = "observation number in the cycle's observation file"
            ov[:] = np.arange(n, dtype=np.int32)
            coord_vars = []
            for j in range(y.coords.shape[1]):
                name, attrs = names[j] if j < len(names) else (f"coord_{j + 1}", {"long_name": f"coordinate {j + 1}"})
                v = ds.createVariable(name, "f8", ("obs",))
                v.setncatts(attrs)
                v[:] = y.coords[:, j]
                coord_vars.append(name)
            coords = " ".join(coord_vars)

            def var(name: str, values: np.ndarray, long_name: str, units: str | None = None, **extra) -> None:
                v = ds.createVariable(name, "f8", ("obs",))
                v.long_name = long_name
                if units is not None:
                    v.units = units
                if coords:
                    v.coordinates = coords
                v.setncatts(extra)
                v[:] = values

            var("obs_value", y.values, "observed value y")
            var("obs_error_variance", y.error_var, "observation error variance (diagonal of R)")
            var("prior_mean", stats.prior_mean, "forecast ensemble mean of H(x)", cell_methods="member: mean")
            var("prior_spread", stats.prior_spread, "forecast ensemble standard deviation of H(x)",
                cell_methods="member: standard_deviation")
            var("posterior_mean", stats.posterior_mean, "analysis ensemble mean of H(x)", cell_methods="member: mean")
            var("posterior_spread", stats.posterior_spread, "analysis ensemble standard deviation of H(x)",
                cell_methods="member: standard_deviation")
            var("omb", y.values - stats.prior_mean, "observation minus background (y - mean H(x_f))")
            var("oma", y.values - stats.posterior_mean, "observation minus analysis (y - mean H(x_a))")
            crps = "mean_j |x_j - y| - 0.5 mean_jl |x_j - x_l| over the members (properscoring.crps_ensemble)"
            var("prior_crps", stats.prior_crps, "continuous ranked probability score of the forecast H(x) against y",
                comment=crps)
            var("posterior_crps", stats.posterior_crps,
                "continuous ranked probability score of the analysis H(x) against y", comment=crps)
            rv = ds.createVariable("prior_rank", "i4", ("obs",))
            rv.long_name = "rank of y in the forecast H(x) perturbed with the observation error"
            rv.valid_range = np.array([0, n_members], dtype=np.int32)
            rv.comment = RANK_METHOD
            if coords:
                rv.coordinates = coords
            rv[:] = stats.prior_rank
            kv = ds.createVariable("kind", "i4", ("obs",))
            kv.long_name = "observation kind code"
            codes = sorted(set(np.unique(y.kinds).tolist()) | set((kind_names or {}).keys()))
            if kind_names:
                kv.flag_values = np.array(codes, dtype=np.int32)
                kv.flag_meanings = " ".join(str(kind_names.get(c, f"kind_{c}")).replace(" ", "_") for c in codes)
            kv[:] = y.kinds
            qv = ds.createVariable("qc", "i1", ("obs",))
            qv.long_name = "quality control flag"
            qv.flag_values = np.array([0, 1, 2], dtype=np.int8)
            qv.flag_meanings = QC_MEANINGS
            qv[:] = flags
            ds.setncatts({
                "Conventions": "CF-1.8", "featureType": "point",
                "title": f"enkflow observation-space diagnostics, cycle {cycle}", "source": "enkflow",
                "cycle": np.int32(cycle), "ensemble_size": np.int32(n_members),
                "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow write_obs_diagnostics",
            })
        finally:
            ds.close()


@dataclass(frozen=True)
class ObsDiagnosticsWriter:
    """The sink :func:`enkflow.experiment.step.analyse` hands each cycle's observation-space
    ensembles to: writes ``directory_of(cycle) / obs_diag.nc`` on rank 0 of the analysis.

    ``directory_of`` maps a cycle to its directory (created if missing). ``metric``: the
    localization's, which names the coordinates; None (a global filter without one): the
    observation space's own (longitude and latitude where they are), else ``coord_1``, ...."""

    directory_of: Callable[[int], Path]
    rank: int = 0
    metric: Metric | None = None

    def path(self, cycle: int) -> Path:
        return Path(self.directory_of(cycle)) / FILE_NAME

    def write(self, cycle: int, y: ObsSet, HX: np.ndarray, HXa: np.ndarray, qc_flags: np.ndarray | None,
              kind_names: Mapping[int, str], coordinate_metric: Metric | None = None) -> None:
        """Write the file of ``cycle`` (rank 0; the other ranks return): ``y``, ``HX`` and ``HXa``
        (n_obs, N) every observation of the cycle (QC-rejected ones included) and H(x) of the forecast
        and of the analysis members, ``qc_flags`` (n_obs,) the QC's verdicts (None: all used);
        ``coordinate_metric``: the observations' own, named where ``metric`` is None."""
        if self.rank != 0:
            return
        p = self.path(cycle)
        p.parent.mkdir(parents=True, exist_ok=True)
        metric = self.metric if self.metric is not None else coordinate_metric
        write_obs_diagnostics(p, y, ObsSpaceStats.from_ensembles(HX, HXa, y, cycle), cycle=cycle, n_members=HX.shape[1],
                              qc_flags=qc_flags, metric=metric.value if metric is not None else None,
                              kind_names=dict(kind_names))


def summary_by_kind(path: str | os.PathLike[str]) -> dict[str, dict[str, float]]:
    """OmB/OmA bias (mean) and RMS of the used observations, and the counts, per kind name (and
    ``"all"``) from one diagnostics file: ``{kind: {n_used, n_rejected, omb_bias, omb_rms, oma_bias,
    oma_rms, prior_spread, posterior_spread}}`` (spreads: RMS of H(x)'s ensemble spread)."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        g = {k: np.asarray(ds.variables[k][:]) for k in ("omb", "oma", "kind", "qc", "prior_spread", "posterior_spread")}
        kv = ds.variables["kind"]
        names: dict[int, str] = {}
        if "flag_meanings" in kv.ncattrs():
            names = dict(zip(np.atleast_1d(kv.flag_values).tolist(), str(kv.flag_meanings).split()))
    out: dict[str, dict[str, float]] = {}
    groups = [("all", np.ones(g["kind"].size, bool))]
    kinds = np.unique(g["kind"]).tolist()
    if len(kinds) > 1 or names:
        groups += [(names.get(k, str(k)), g["kind"] == k) for k in kinds]
    for name, sel in groups:
        used = sel & (g["qc"] == QC_USED)
        d = {"n_used": float(used.sum()), "n_rejected": float((sel & ~used).sum())}
        for key in ("omb", "oma"):
            v = g[key][used]
            d[f"{key}_bias"] = float(v.mean()) if v.size else float("nan")
            d[f"{key}_rms"] = float(np.sqrt(np.mean(v * v))) if v.size else float("nan")
        for key in ("prior_spread", "posterior_spread"):
            v = g[key][used]
            d[key] = float(np.sqrt(np.mean(v * v))) if v.size else float("nan")
        out[name] = d
    return out
