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
from enkflow.obs.gathered import RootOrder
from enkflow.parallel import Comm
from enkflow.parallel.together import raise_together

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


# The float64 columns after the coordinates, in file order: (variable, long name, further attributes).
# Every column but omb and oma is the ObsSet's or the ObsSpaceStats' array of the variable's name.
_CRPS = "mean_j |x_j - y| - 0.5 mean_jl |x_j - x_l| over the members (properscoring.crps_ensemble)"
_FLOAT_VARS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("obs_value", "observed value y", {}),
    ("obs_error_variance", "observation error variance (diagonal of R)", {}),
    ("prior_mean", "forecast ensemble mean of H(x)", {"cell_methods": "member: mean"}),
    ("prior_spread", "forecast ensemble standard deviation of H(x)", {"cell_methods": "member: standard_deviation"}),
    ("posterior_mean", "analysis ensemble mean of H(x)", {"cell_methods": "member: mean"}),
    ("posterior_spread", "analysis ensemble standard deviation of H(x)",
     {"cell_methods": "member: standard_deviation"}),
    ("omb", "observation minus background (y - mean H(x_f))", {}),
    ("oma", "observation minus analysis (y - mean H(x_a))", {}),
    ("prior_crps", "continuous ranked probability score of the forecast H(x) against y", {"comment": _CRPS}),
    ("posterior_crps", "continuous ranked probability score of the analysis H(x) against y", {"comment": _CRPS}),
)


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
    def from_ensembles(cls, HX: np.ndarray, HXa: np.ndarray, y: ObsSet, cycle: int, ids: np.ndarray | None = None,
                       n_total: int | None = None) -> "ObsSpaceStats":
        """From H(x) of the forecast and the analysis ensembles, (n_obs, N) each, and the observations ``y``
        of ``cycle`` (which seeds the rank's perturbations). ``ids``, ``n_total``: ``y`` are the
        observations ``ids`` (sorted global indices) of the cycle's ``n_total`` (those a rank owns)."""
        def ms(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            sd = A.std(axis=1, ddof=1) if A.shape[1] > 1 else np.zeros(A.shape[0])
            return A.mean(axis=1), sd

        HX, HXa = np.asarray(HX, dtype=np.float64), np.asarray(HXa, dtype=np.float64)
        pm, ps = ms(HX)
        am, as_ = ms(HXa)
        return cls(pm, ps, am, as_, ensemble_crps(HX, y.values, ids, n_total),
                   ensemble_crps(HXa, y.values, ids, n_total),
                   prior_ranks(HX, y.values, y.error_var, cycle, ids, n_total))


@dataclass(frozen=True)
class _Columns:
    """The per-observation columns of the file, by name (:func:`_column_names`), for the observations
    ``y`` that one rank has: all of the cycle's, or the ones it owns."""

    y: ObsSet
    stats: ObsSpaceStats
    flags: np.ndarray  # (n_obs,) int8

    def __call__(self, name: str) -> np.ndarray:
        if name.startswith("coord "):
            # A rank that owns no observations may have fewer coordinate columns than the others.
            return self.y.coords[:, int(name.removeprefix("coord "))] if self.y.n_obs else np.zeros(0)
        match name:
            case "obs_value":
                return self.y.values
            case "obs_error_variance":
                return self.y.error_var
            case "omb":
                return self.y.values - self.stats.prior_mean
            case "oma":
                return self.y.values - self.stats.posterior_mean
            case "kind":
                return self.y.kinds
            case "qc":
                return self.flags
        return np.asarray(getattr(self.stats, name))


def _column_names(n_coords: int) -> list[str]:
    """Every per-observation column but ``obs`` (its index), in the order the file is written."""
    return ([f"coord {j}" for j in range(n_coords)] + [name for name, _, _ in _FLOAT_VARS]
            + ["prior_rank", "kind", "qc"])


def _qc_flags(qc_flags: np.ndarray | None, n: int) -> np.ndarray:
    flags = np.zeros(n, np.int8) if qc_flags is None else np.asarray(qc_flags, dtype=np.int8).reshape(-1)
    if flags.shape != (n,):
        raise ValueError(f"qc_flags has shape {flags.shape}, expected ({n},)")
    return flags


def _shared_coordinate_count(comm: Comm, y: ObsSet) -> int:
    """Collective: the number of coordinates of the observations, the same on every rank that owns some."""
    dims = {d for d, n in comm.allgather_obj((y.coords.shape[1], y.n_obs)) if n}
    if len(dims) > 1:
        raise ValueError(f"the ranks' observations have different numbers of coordinates: {sorted(dims)}")
    return dims.pop() if dims else y.coords.shape[1]


def _root(column: np.ndarray | None) -> np.ndarray:
    """A column gathered on rank 0, which always receives one."""
    if column is None:
        raise RuntimeError("a gathered column is missing on rank 0")
    return column


@dataclass(frozen=True)
class _FileMeta:
    """What the file says beside its columns."""

    cycle: int
    n_members: int
    metric: str | None
    kind_names: dict[int, str]


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
    columns = _Columns(y, stats, _qc_flags(qc_flags, y.n_obs))
    _write_file(Path(path), y.n_obs, y.coords.shape[1], columns, _FileMeta(cycle, n_members, metric, kind_names or {}))


def _write_file(path: Path, n: int, n_coords: int, column: Callable[[str], np.ndarray], meta: _FileMeta) -> None:
    """Write the file of ``n`` observations atomically to ``path``, asking ``column`` for each of
    :func:`_column_names` in turn ((n,) each, in the file's order of observations)."""
    with atomic_output(path) as tmp:
        ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            ds.createDimension("obs", n)
            ov = ds.createVariable("obs", "i4", ("obs",))
            ov.long_name = "observation number in the cycle's observation file"
            ov[:] = np.arange(n, dtype=np.int32)
            coords = " ".join(_coordinate_name(meta.metric, j)[0] for j in range(n_coords))
            for name in _column_names(n_coords):
                _write_column(ds, name, column(name), coords, meta)
            ds.setncatts({
                "Conventions": "CF-1.8", "featureType": "point",
                "title": f"enkflow observation-space diagnostics, cycle {meta.cycle}", "source": "enkflow",
                "cycle": np.int32(meta.cycle), "ensemble_size": np.int32(meta.n_members),
                "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow write_obs_diagnostics",
            })
        finally:
            ds.close()


def _coordinate_name(metric: str | None, j: int) -> tuple[str, dict[str, str]]:
    """The variable name and attributes of coordinate ``j`` under ``metric``."""
    names = _COORDS.get(metric or "", ())
    return names[j] if j < len(names) else (f"coord_{j + 1}", {"long_name": f"coordinate {j + 1}"})


def _write_column(ds: netCDF4.Dataset, name: str, values: np.ndarray, coords: str, meta: _FileMeta) -> None:
    """Create the variable of column ``name`` with its attributes and write its ``values`` (n,);
    ``coords``: the coordinate variables' names, space-separated."""
    if name.startswith("coord "):
        var_name, attrs = _coordinate_name(meta.metric, int(name.removeprefix("coord ")))
        v = ds.createVariable(var_name, "f8", ("obs",))
        v.setncatts(attrs)
    elif name == "prior_rank":
        v = ds.createVariable("prior_rank", "i4", ("obs",))
        v.long_name = "rank of y in the forecast H(x) perturbed with the observation error"
        v.valid_range = np.array([0, meta.n_members], dtype=np.int32)
        v.comment = RANK_METHOD
        if coords:
            v.coordinates = coords
    elif name == "kind":
        v = ds.createVariable("kind", "i4", ("obs",))
        v.long_name = "observation kind code"
        codes = sorted(set(np.unique(values).tolist()) | set(meta.kind_names.keys()))
        if meta.kind_names:
            v.flag_values = np.array(codes, dtype=np.int32)
            v.flag_meanings = " ".join(str(meta.kind_names.get(c, f"kind_{c}")).replace(" ", "_") for c in codes)
    elif name == "qc":
        v = ds.createVariable("qc", "i1", ("obs",))
        v.long_name = "quality control flag"
        v.flag_values = np.array([0, 1, 2], dtype=np.int8)
        v.flag_meanings = QC_MEANINGS
    else:
        long_name, extra = next((ln, ex) for n, ln, ex in _FLOAT_VARS if n == name)
        v = ds.createVariable(name, "f8", ("obs",))
        v.long_name = long_name
        if coords:
            v.coordinates = coords
        v.setncatts(extra)
    v[:] = values


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
        write_obs_diagnostics(self._created(cycle), y, ObsSpaceStats.from_ensembles(HX, HXa, y, cycle), cycle=cycle,
                              n_members=HX.shape[1], qc_flags=qc_flags, metric=self._metric(coordinate_metric),
                              kind_names=dict(kind_names))

    def write_distributed(self, cycle: int, order: RootOrder, y: ObsSet, HX: np.ndarray, HXa: np.ndarray,
                          qc_flags: np.ndarray | None, kind_names: Mapping[int, str],
                          coordinate_metric: Metric | None = None) -> None:
        """Collective over ``order.comm``: the file of ``cycle``, written by its rank 0, from the
        observations each rank owns (``order``: their sorted global indices ``order.own`` out of the
        cycle's ``order.n_total``): ``y`` them, ``HX``/``HXa`` (n_own, N) their H(x), ``qc_flags``
        (n_own,) or None on every rank. Each owner computes its statistics; the columns are gathered to
        rank 0 in global order one at a time, so the file equals :meth:`write`'s of all the cycle's
        observations (history aside)."""
        comm, n_total = order.comm, order.n_total
        stats = ObsSpaceStats.from_ensembles(HX, HXa, y, cycle, order.own, n_total)
        columns = _Columns(y, stats, _qc_flags(qc_flags, y.n_obs))
        n_coords = _shared_coordinate_count(comm, y)
        names = _column_names(n_coords)
        gathered: set[str] = set()

        def gather(name: str) -> np.ndarray:
            gathered.add(name)
            return _root(order.gather(columns(name)))

        def write() -> None:
            try:
                if comm.rank == 0:
                    meta = _FileMeta(cycle, HX.shape[1], self._metric(coordinate_metric), dict(kind_names))
                    _write_file(self._created(cycle), n_total, n_coords, gather, meta)
            finally:  # every column's gather, also where rank 0 failed to write: no rank is left waiting
                for name in names:
                    if name not in gathered:
                        order.gather(columns(name))

        raise_together(comm, write)

    def _created(self, cycle: int) -> Path:
        p = self.path(cycle)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def _metric(self, coordinate_metric: Metric | None) -> str | None:
        metric = self.metric if self.metric is not None else coordinate_metric
        return metric.value if metric is not None else None
