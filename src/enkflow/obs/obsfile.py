"""The observation file: observations of one analysis time with an index-selection H.

Layout (``docs/formats.md``, section "Observation file"): one dimension ``obs``
and the variables

* ``value(obs)`` float64 - observed values y;
* ``error_std(obs)`` float64 - observation error standard deviations, > 0,
  same units as ``value`` (R = diag(error_std**2)); a file may hold
  ``error_var(obs)`` (the variances) instead;
* ``lon(obs)``, ``lat(obs)`` float64 - location in degrees east / north;
* ``state_index(obs)`` int64 - the 0-based state row observed: H(x) = x[state_index];
* ``kind(obs)`` int32 - observation kind code (optional on reading, 0 if absent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.errors import FileFormatError, InputError
from enkflow.analysis.obsset import ObsSet

OBS_DIM = "obs"
VALUE = "value"
ERROR_STD = "error_std"
ERROR_VAR = "error_var"
LON = "lon"
LAT = "lat"
STATE_INDEX = "state_index"
KIND = "kind"

# netCDF4-python format names this module writes; NetCDF-3 classic/64-bit offset lack int64.
WRITABLE_FORMATS = ("NETCDF4", "NETCDF4_CLASSIC", "NETCDF3_64BIT_DATA")


@dataclass(frozen=True, eq=False)
class ObsFile:
    """An observation file's contents.

    Attributes
    ----------
    obs : ObsSet
        Values, error variances (``error_std**2``), coordinates ``(lon, lat)`` in
        degrees, kinds.
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


def _fail(path: Path, variable: str | None, message: str) -> FileFormatError:
    return FileFormatError(message, path=str(path), variable=variable)


def _read_obs_var(ds: Any, path: Path, name: str, n: int, *, integer: bool) -> np.ndarray:
    if name not in ds.variables:
        raise _fail(path, name, f"variable missing; an observation file needs {VALUE}, {ERROR_STD} (or {ERROR_VAR}), {LON}, {LAT}, {STATE_INDEX}")
    var = ds.variables[name]
    if var.dimensions != (OBS_DIM,):
        raise _fail(path, name, f"has dimensions {var.dimensions}, expected ('{OBS_DIM}',)")
    if integer and not np.issubdtype(var.dtype, np.integer):
        raise _fail(path, name, f"must be an integer variable, has dtype {var.dtype}")
    data = var[:]
    if np.ma.is_masked(data):
        i = int(np.argmax(np.ma.getmaskarray(data)))
        raise _fail(path, name, f"missing value (_FillValue) at index {i}")
    a = np.asarray(np.ma.getdata(data))
    if a.shape != (n,):
        raise _fail(path, name, f"has shape {a.shape}, expected ({n},)")
    if not integer:
        a = a.astype(np.float64, copy=False)
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.argmax(bad))
            raise _fail(path, name, f"holds NaN or Inf at index {i}")
    return a


def read_obs_file(path: str | Path, *, n_state: int | None = None) -> ObsFile:
    """Read and validate an observation file.

    Parameters
    ----------
    path : str or Path
    n_state : int, optional
        Length of the state vector; when given, every ``state_index`` must be below it.

    Raises
    ------
    FileFormatError
        Naming the file and variable: missing file, variable or dimension, wrong
        shape or type, NaN/Inf, missing values, ``error_std <= 0``, latitude
        outside [-90, 90], ``state_index`` out of range (with the first bad index).
    """
    import netCDF4

    p = Path(path)
    if not p.is_file():
        raise _fail(p, None, "observation file not found")
    try:
        ds = netCDF4.Dataset(p, "r")
    except OSError as exc:
        raise _fail(p, None, f"cannot be opened as NetCDF: {exc}") from None
    with ds:
        if OBS_DIM not in ds.dimensions:
            raise _fail(p, None, f"no '{OBS_DIM}' dimension; dimensions are {list(ds.dimensions)}")
        n = len(ds.dimensions[OBS_DIM])
        values = _read_obs_var(ds, p, VALUE, n, integer=False)
        if ERROR_STD in ds.variables:
            std = _read_obs_var(ds, p, ERROR_STD, n, integer=False)
            err_name, err = ERROR_STD, std
            error_var = std * std
        elif ERROR_VAR in ds.variables:
            err_name = ERROR_VAR
            err = error_var = _read_obs_var(ds, p, ERROR_VAR, n, integer=False)
        else:
            raise _fail(p, ERROR_STD, f"variable missing (and no '{ERROR_VAR}' either)")
        if n and (err <= 0).any():
            i = int(np.argmax(err <= 0))
            raise _fail(p, err_name, f"must be > 0; index {i} has {err[i]!r}")
        lon = _read_obs_var(ds, p, LON, n, integer=False)
        lat = _read_obs_var(ds, p, LAT, n, integer=False)
        if n and (np.abs(lat) > 90.0).any():
            i = int(np.argmax(np.abs(lat) > 90.0))
            raise _fail(p, LAT, f"must lie in [-90, 90] degrees; index {i} has {lat[i]!r}")
        index = _read_obs_var(ds, p, STATE_INDEX, n, integer=True).astype(np.int64)
        if n and index.min() < 0:
            i = int(np.argmax(index < 0))
            raise _fail(p, STATE_INDEX, f"must be >= 0; index {i} has {index[i]}")
        if n_state is not None and n and index.max() >= n_state:
            i = int(np.argmax(index >= n_state))
            raise _fail(p, STATE_INDEX, f"must be < n_state = {n_state}; index {i} has {index[i]}")
        if KIND in ds.variables:
            kinds = _read_obs_var(ds, p, KIND, n, integer=True)
            if n and (kinds.min() < np.iinfo(np.int32).min or kinds.max() > np.iinfo(np.int32).max):
                raise _fail(p, KIND, "values do not fit in int32")
        else:
            kinds = np.zeros(n, np.int32)
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    obs = ObsSet(values, error_var, np.column_stack([lon, lat]), kinds.astype(np.int32))
    return ObsFile(obs, index, attrs)


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
