"""The observation file: observations of one analysis time with an index-selection H.

Layout (``docs/formats.md``, section "Observation file"): one dimension ``obs``
and the variables

* ``value(obs)`` float64 - observed values y;
* ``error_std(obs)`` float64 - observation error standard deviations, > 0,
  same units as ``value`` (R = diag(error_std**2)); a file may hold
  ``error_var(obs)`` (the variances) instead;
* ``lon(obs)``, ``lat(obs)`` float64 - location in degrees east / north; needed
  only where the analysis measures distance on the sphere (``metric = "sphere"``);
* ``state_index(obs)`` int64 - the 0-based state row observed: H(x) = x[state_index];
* ``kind(obs)`` int32 - observation kind code (optional on reading, 0 if absent).

:func:`load_for_state` is the one place an observation file is checked against a
state and turned into the analysis' :class:`ObsSet`: the analysis calls it, and
``enkflow run`` calls it for every cycle's file before the first forecast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.errors import ConfigError, FileFormatError, InputError
from enkflow.analysis.obsset import ObsSet
from enkflow.config import Metric
from enkflow.state import StateLayout

OBS_DIM = "obs"
VALUE = "value"
ERROR_STD = "error_std"
ERROR_VAR = "error_var"
LON = "lon"
LAT = "lat"
STATE_INDEX = "state_index"
KIND = "kind"

# Accepted ranges, degrees: latitudes, and longitudes in either the [-180, 180] or the [0, 360] convention.
LAT_RANGE = (-90.0, 90.0)
LON_RANGE = (-180.0, 360.0)

# netCDF4-python format names this module writes; NetCDF-3 classic/64-bit offset lack int64.
WRITABLE_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_64BIT_DATA")


@dataclass(frozen=True, eq=False)
class ObsFile:
    """An observation file's contents.

    Attributes
    ----------
    obs : ObsSet
        Values, error variances (``error_std**2``), coordinates, kinds. Read by
        :func:`read_obs_file`: ``(lon, lat)`` in degrees, or ``(n_obs, 0)`` when the
        file has none; from :func:`load_for_state`: the observed state rows' coordinates.
    state_index : (n_obs,) int64
        0-based state row observed by each observation (H is this selection).
    attrs : dict
        The file's global attributes.
    """

    obs: ObsSet
    state_index: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = np.asarray(self.state_index)
        if not np.issubdtype(s.dtype, np.integer):
            raise InputError(f"state_index must be integer, got dtype {s.dtype}", item="state_index")
        s = np.ascontiguousarray(s, dtype=np.int64).reshape(-1)
        if s.shape != (self.obs.n_obs,):
            raise InputError(f"state_index has {s.size} elements, expected {self.obs.n_obs} (one per observation)", item="state_index")
        if s.size and s.min() < 0:
            i = int(np.argmax(s < 0))
            raise InputError(f"state_index must be >= 0; observation {i} has {s[i]}", item="state_index", index=i)
        object.__setattr__(self, "state_index", s)

    @property
    def n_obs(self) -> int:
        return self.obs.n_obs


@dataclass(frozen=True)
class _Source:
    """The file being read, and the cycle it serves (named in every error)."""

    path: Path
    cycle: int | None = None

    def fail(self, variable: str | None, message: str) -> FileFormatError:
        where = "" if self.cycle is None else f" (observation file of cycle {self.cycle})"
        return FileFormatError(message + where, path=str(self.path), variable=variable)


def _first(bad: np.ndarray) -> int:
    return int(np.argmax(bad))


def _read_obs_var(ds: Any, src: _Source, name: str, n: int, *, integer: bool) -> np.ndarray:
    if name not in ds.variables:
        raise src.fail(name, f"variable missing; an observation file needs {VALUE}, {ERROR_STD} (or {ERROR_VAR}), "
                             f"{STATE_INDEX}, and {LON}, {LAT} where the analysis metric is 'sphere'")
    var = ds.variables[name]
    if var.dimensions != (OBS_DIM,):
        raise src.fail(name, f"has dimensions {var.dimensions}, expected ('{OBS_DIM}',)")
    if integer and not np.issubdtype(var.dtype, np.integer):
        raise src.fail(name, f"must be an integer variable, has dtype {var.dtype}")
    data = var[:]
    if np.ma.is_masked(data):
        raise src.fail(name, f"missing value (_FillValue) at index {_first(np.ma.getmaskarray(data))}")
    a = np.asarray(np.ma.getdata(data))
    if a.shape != (n,):
        raise src.fail(name, f"has shape {a.shape}, expected ({n},)")
    if not integer:
        a = a.astype(np.float64, copy=False)
        bad = ~np.isfinite(a)
        if bad.any():
            raise src.fail(name, f"holds NaN or Inf at index {_first(bad)}")
    return a


def _check_range(src: _Source, name: str, a: np.ndarray, lo: float, hi: float) -> None:
    bad = (a < lo) | (a > hi)
    if bad.any():
        i = _first(bad)
        raise src.fail(name, f"must lie in [{lo:g}, {hi:g}] degrees; index {i} has {float(a[i])!r}")


def read_obs_file(path: str | Path, *, n_state: int | None = None, lonlat: bool = True,
                  cycle: int | None = None) -> ObsFile:
    """Read and validate an observation file.

    Parameters
    ----------
    path : str or Path
    n_state : int, optional
        Length of the state vector; when given, every ``state_index`` must be below it.
    lonlat : bool
        True: ``lon`` and ``lat`` are required and must lie in [-180, 360] and
        [-90, 90] degrees (a sphere metric measures with them). False: they are
        optional and, where present, any finite numbers (a Cartesian metric places
        observations by ``state_index``; a file may hold grid indices there).
    cycle : int, optional
        The cycle the file serves; named in every error.

    Raises
    ------
    FileFormatError
        Naming the file and variable (and the cycle): missing file, variable or
        dimension, wrong shape or type, NaN/Inf, missing values, ``error_std <= 0``,
        ``lon``/``lat`` out of range, ``state_index`` out of range (with the first bad index).
    """
    import netCDF4

    src = _Source(Path(path), cycle)
    p = src.path
    if not p.is_file():
        raise src.fail(None, "observation file not found")
    try:
        ds = netCDF4.Dataset(p, "r")
    except OSError as exc:
        raise src.fail(None, f"cannot be opened as NetCDF: {exc}") from None
    with ds:
        if OBS_DIM not in ds.dimensions:
            raise src.fail(None, f"no '{OBS_DIM}' dimension; dimensions are {list(ds.dimensions)}")
        n = len(ds.dimensions[OBS_DIM])
        values = _read_obs_var(ds, src, VALUE, n, integer=False)
        if ERROR_STD in ds.variables:
            std = _read_obs_var(ds, src, ERROR_STD, n, integer=False)
            err_name, err = ERROR_STD, std
            error_var = std * std
        elif ERROR_VAR in ds.variables:
            err_name = ERROR_VAR
            err = error_var = _read_obs_var(ds, src, ERROR_VAR, n, integer=False)
        else:
            raise src.fail(ERROR_STD, f"variable missing (and no '{ERROR_VAR}' either)")
        if n and (err <= 0).any():
            i = _first(err <= 0)
            raise src.fail(err_name, f"must be > 0; index {i} has {float(err[i])!r}")
        cols = []
        for name, (lo, hi) in ((LON, LON_RANGE), (LAT, LAT_RANGE)):
            if not lonlat and name not in ds.variables:
                continue
            a = _read_obs_var(ds, src, name, n, integer=False)
            if lonlat:
                _check_range(src, name, a, lo, hi)
            cols.append(a)
        index = _read_obs_var(ds, src, STATE_INDEX, n, integer=True).astype(np.int64)
        if n and index.min() < 0:
            i = _first(index < 0)
            raise src.fail(STATE_INDEX, f"must be >= 0; index {i} has {index[i]}")
        if n_state is not None and n and index.max() >= n_state:
            i = _first(index >= n_state)
            raise src.fail(STATE_INDEX, f"must be < n_state = {n_state}; index {i} has {index[i]}")
        if KIND in ds.variables:
            kinds = _read_obs_var(ds, src, KIND, n, integer=True)
            if n and (kinds.min() < np.iinfo(np.int32).min or kinds.max() > np.iinfo(np.int32).max):
                raise src.fail(KIND, "values do not fit in int32")
        else:
            kinds = np.zeros(n, np.int32)
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    coords = np.column_stack(cols) if cols else np.zeros((n, 0))
    obs = ObsSet(values, error_var, coords, kinds.astype(np.int32))
    return ObsFile(obs, index, attrs)


def load_for_state(path: str | Path, layout: StateLayout, metric: Metric | None, *,
                   cycle: int | None = None) -> ObsFile:
    """Read ``path`` and check it against the state ``layout`` and the analysis ``metric``.

    Every check of an observation file that needs no forecast: the file's own
    (:func:`read_obs_file`: NaN/Inf, ``error_std <= 0``, ``state_index`` outside the
    state's ``layout.n_rows`` rows, lon/lat ranges where the metric is the sphere),
    the metric against the coordinates the state has, and the observations'
    locations. The analysis and ``enkflow run``'s pre-flight check both call it.

    Parameters
    ----------
    layout : StateLayout
        The state the observations observe (from the template restart).
    metric : Metric or None
        The localization metric (``None``: a global analysis, no distances).
    cycle : int, optional
        The cycle the file serves; named in every error.

    Returns
    -------
    ObsFile
        ``.obs``: values, error variances, kinds, and as coordinates those of the
        observed state rows, ``layout.coords[state_index]`` (n_obs, n_dim), in the
        metric's units (the observation sits at the state row it observes);
        ``.state_index`` (n_obs,) int64; ``.attrs``.

    Raises
    ------
    FileFormatError
        Naming the observation file (or, for the state's coordinates, the template
        restart), the variable, the cycle and the first bad index.
    ConfigError
        Key ``analysis.localization.metric``: the sphere metric with a state whose
        coordinates are not longitude/latitude.
    """
    sphere = metric is Metric.SPHERE
    if sphere and layout.coord_kind != "lonlat":
        raise ConfigError(
            f"the sphere metric needs longitude/latitude coordinates; the state of {layout.template} has "
            f"{', '.join(layout.coord_names)} (set state.coordinates, or use metric 'cartesian')",
            key="analysis.localization.metric",
        )
    of = read_obs_file(path, n_state=layout.n_rows, lonlat=sphere, cycle=cycle)
    coords = layout.coords[of.state_index]
    if sphere:
        # The observations take the state's coordinates: those must be on the globe too.
        src = _Source(Path(layout.template), cycle)
        for col, (lo, hi) in ((0, LON_RANGE), (1, LAT_RANGE)):
            bad = (coords[:, col] < lo) | (coords[:, col] > hi) | ~np.isfinite(coords[:, col])
            if bad.any():
                i = _first(bad)
                raise src.fail(layout.coord_names[col], (
                    f"state coordinate must lie in [{lo:g}, {hi:g}] degrees for the sphere metric; observation {i} "
                    f"of {path} (state_index {of.state_index[i]}) is at {float(coords[i, col])!r}"))
    obs = ObsSet(of.obs.values, of.obs.error_var, coords, of.obs.kinds)
    return ObsFile(obs, of.state_index, of.attrs)


def write_obs_file(
    path: str | Path,
    data: ObsFile,
    *,
    format: str = "NETCDF4",
    units: str = "1",
    kind_names: Sequence[str] | None = None,
) -> None:
    """Write ``data`` as an observation file at ``path`` (overwriting it, not atomically).

    Parameters
    ----------
    data : ObsFile
        ``data.obs.coords`` must be ``(n_obs, 2)``: lon, lat in degrees.
        ``data.attrs`` become global attributes.
    format : str
        netCDF4-python format name, one of :data:`WRITABLE_FORMATS`.
    units : str
        Units of ``value`` and ``error_std`` (CF/UDUNITS string).
    kind_names : sequence of str, optional
        Names of kind codes 0, 1, ...; written as CF ``flag_values``/``flag_meanings``.
    """
    import netCDF4

    if format not in WRITABLE_FORMATS:
        raise InputError(f"format {format!r} cannot hold int64 state_index; use one of {', '.join(WRITABLE_FORMATS)}", item="format")
    obs = data.obs
    if obs.coords.shape[1] != 2:
        raise InputError(f"obs.coords has {obs.coords.shape[1]} columns, expected 2 (lon, lat in degrees)", item="obs.coords")
    # HDF5 cannot lay out a zero-length variable contiguously.
    extra: dict[str, Any] = {"contiguous": True} if format.startswith("NETCDF4") and obs.n_obs else {}
    with netCDF4.Dataset(path, "w", format=format) as ds:
        ds.set_fill_off()
        ds.createDimension(OBS_DIM, obs.n_obs)

        def var(name: str, dtype: str, values: np.ndarray, attrs: Mapping[str, Any]) -> None:
            v = ds.createVariable(name, dtype, (OBS_DIM,), **extra)
            v.setncatts(dict(attrs))
            v[:] = values

        var(VALUE, "f8", obs.values, {"long_name": "observed value", "units": units})
        var(ERROR_STD, "f8", np.sqrt(obs.error_var), {"long_name": "observation error standard deviation", "units": units})
        var(LON, "f8", obs.coords[:, 0], {"standard_name": "longitude", "long_name": "observation longitude", "units": "degrees_east"})
        var(LAT, "f8", obs.coords[:, 1], {"standard_name": "latitude", "long_name": "observation latitude", "units": "degrees_north"})
        var(STATE_INDEX, "i8", data.state_index, {"long_name": "0-based state-vector row observed (H selects it)", "units": "1"})
        kind_attrs: dict[str, Any] = {"long_name": "observation kind code"}
        if kind_names:
            kind_attrs["flag_values"] = np.arange(len(kind_names), dtype=np.int32)
            kind_attrs["flag_meanings"] = " ".join(kind_names)
        var(KIND, "i4", obs.kinds, kind_attrs)
        ds.setncatts(dict(data.attrs))
