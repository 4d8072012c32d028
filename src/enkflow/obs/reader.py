"""Reading an observation file (:mod:`enkflow.obs.fileformat`): every variable checked as it is read,
each error naming the file, the variable and the cycle the file serves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import FileFormatError
from enkflow.obs.fileformat import (ERROR_STD, ERROR_VAR, KIND, LAT, LAT_RANGE, LEVEL, LON, LON_RANGE, OBS_DIM,
                                    STATE_INDEX, TIME, VALUE, ObsFile)


@dataclass(frozen=True)
class Source:
    """The file being read (``given``: its path as the caller gave it), and the cycle it serves
    (named in every error)."""

    given: str | Path
    cycle: int | None = None

    @property
    def path(self) -> Path:
        return Path(self.given)

    def fail(self, variable: str | None, message: str) -> FileFormatError:
        where = "" if self.cycle is None else f" (observation file of cycle {self.cycle})"
        return FileFormatError(message + where, path=str(self.path), variable=variable)


def first(bad: np.ndarray) -> int:
    """The index of the first True of ``bad``, (n,) bool."""
    return int(np.argmax(bad))


def read_obs_var(ds: netCDF4.Dataset, src: Source, name: str, n: int, *, integer: bool, why: str = "") -> np.ndarray:
    """The variable ``name(obs)`` of ``n`` values, (n,): integer as stored, else float64 and finite."""
    if name not in ds.variables:
        raise src.fail(name, "variable missing" + (f"; {why}" if why else
                                                   f"; an observation file needs {VALUE} and {ERROR_STD} (or {ERROR_VAR})"))
    var = ds.variables[name]
    if var.dimensions != (OBS_DIM,):
        raise src.fail(name, f"has dimensions {var.dimensions}, expected ('{OBS_DIM}',)")
    if integer and not np.issubdtype(var.dtype, np.integer):
        raise src.fail(name, f"must be an integer variable, has dtype {var.dtype}")
    data = var[:]
    if np.ma.is_masked(data):
        raise src.fail(name, f"missing value (_FillValue) at index {first(np.ma.getmaskarray(data))}")
    a = np.asarray(np.ma.getdata(data))
    if a.shape != (n,):
        raise src.fail(name, f"has shape {a.shape}, expected ({n},)")
    if not integer:
        a = a.astype(np.float64, copy=False)
        bad = ~np.isfinite(a)
        if bad.any():
            raise src.fail(name, f"holds NaN or Inf at index {first(bad)}")
    return a


def _check_range(src: Source, name: str, a: np.ndarray, lo: float, hi: float) -> None:
    bad = (a < lo) | (a > hi)
    if bad.any():
        i = first(bad)
        raise src.fail(name, f"must lie in [{lo:g}, {hi:g}] degrees; index {i} has {float(a[i])!r}")


def _flag_names(var: netCDF4.Variable) -> dict[int, str]:
    """Kind code -> name from CF ``flag_values``/``flag_meanings`` (empty where absent or inconsistent)."""
    if "flag_values" not in var.ncattrs() or "flag_meanings" not in var.ncattrs():
        return {}
    codes = np.atleast_1d(var.getncattr("flag_values"))
    names = str(var.getncattr("flag_meanings")).split()
    return {int(c): n for c, n in zip(codes, names)} if len(names) == codes.size else {}


def _error_var(ds: netCDF4.Dataset, src: Source, n: int) -> np.ndarray:
    """(n,) error variances: ``error_std**2``, or the file's ``error_var``; all > 0."""
    if ERROR_STD in ds.variables:
        std = read_obs_var(ds, src, ERROR_STD, n, integer=False)
        err_name, err = ERROR_STD, std
        error_var = std * std
    elif ERROR_VAR in ds.variables:
        err_name = ERROR_VAR
        err = error_var = read_obs_var(ds, src, ERROR_VAR, n, integer=False)
    else:
        raise src.fail(ERROR_STD, f"variable missing (and no '{ERROR_VAR}' either)")
    if n and (err <= 0).any():
        i = first(err <= 0)
        raise src.fail(err_name, f"must be > 0; index {i} has {float(err[i])!r}")
    return error_var


def _coordinates(ds: netCDF4.Dataset, src: Source, n: int, lonlat: bool,
                 coord_vars: Sequence[str] | None) -> list[np.ndarray]:
    """The coordinate variables asked for (see :func:`read_obs_file`), one (n,) column each."""
    ranges = {LON: LON_RANGE, LAT: LAT_RANGE}
    if coord_vars is None:
        names = [c for c in (LON, LAT) if lonlat or c in ds.variables]
        checked = lonlat
        why = f"the sphere metric needs {LON} and {LAT}"
    else:
        names, checked = list(coord_vars), True
        why = f"observations located by coordinates need {', '.join(coord_vars)}"
    cols = []
    for name in names:
        a = read_obs_var(ds, src, name, n, integer=False, why=why)
        if checked and name in ranges:
            _check_range(src, name, a, *ranges[name])
        cols.append(a)
    return cols


def _state_index(ds: netCDF4.Dataset, src: Source, n: int, n_state: int | None) -> np.ndarray:
    """(n,) int64 ``state_index``, each in [0, n_state)."""
    index = read_obs_var(ds, src, STATE_INDEX, n, integer=True,
                         why=f"interpolation 'index' locates observations by {STATE_INDEX} (or set "
                             "observations.interpolation = 'nearest' or 'bilinear' to use their coordinates)"
                         ).astype(np.int64)
    if n and index.min() < 0:
        i = first(index < 0)
        raise src.fail(STATE_INDEX, f"must be >= 0; index {i} has {index[i]}")
    if n_state is not None and n and index.max() >= n_state:
        i = first(index >= n_state)
        raise src.fail(STATE_INDEX, f"must be < n_state = {n_state}; index {i} has {index[i]}")
    return index


def _kinds(ds: netCDF4.Dataset, src: Source, n: int) -> tuple[np.ndarray, dict[int, str]]:
    """(n,) kind codes (0 without ``kind``) and the names its flag attributes give them."""
    if KIND not in ds.variables:
        return np.zeros(n, np.int32), {}
    kinds = read_obs_var(ds, src, KIND, n, integer=True)
    if n and (kinds.min() < np.iinfo(np.int32).min or kinds.max() > np.iinfo(np.int32).max):
        raise src.fail(KIND, "values do not fit in int32")
    return kinds, _flag_names(ds.variables[KIND])


def read_obs_file(path: str | Path, *, n_state: int | None = None, lonlat: bool = True,
                  cycle: int | None = None, coord_vars: Sequence[str] | None = None,
                  state_index: bool | None = True) -> ObsFile:
    """Read and validate an observation file.

    Parameters
    ----------
    path : str or Path
    n_state : int, optional
        Length of the state vector; when given, every ``state_index`` must be below it.
    lonlat : bool
        Without ``coord_vars``: True reads ``lon`` and ``lat``, required and in [-180, 360] and
        [-90, 90] degrees; False reads them where present, any finite numbers.
    cycle : int, optional
        The cycle the file serves; named in every error.
    coord_vars : sequence of str, optional
        The coordinate variables to read, required (``lon``/``lat`` range-checked); ``()``: none.
    state_index : bool or None
        True: ``state_index`` required; None: read where present; False: not read.

    Raises
    ------
    FileFormatError
        Naming the file and variable (and the cycle): missing file, variable or
        dimension, wrong shape or type, NaN/Inf, missing values, ``error_std <= 0``,
        ``lon``/``lat`` out of range, ``state_index`` out of range (with the first bad index).
    """
    src = Source(Path(path), cycle)
    if not src.path.is_file():
        raise src.fail(None, "observation file not found")
    try:
        ds = netCDF4.Dataset(src.path, "r")
    except OSError as exc:
        raise src.fail(None, f"cannot be opened as NetCDF: {exc}") from None
    with ds:
        if OBS_DIM not in ds.dimensions:
            raise src.fail(None, f"no '{OBS_DIM}' dimension; dimensions are {list(ds.dimensions)}")
        n = len(ds.dimensions[OBS_DIM])
        values = read_obs_var(ds, src, VALUE, n, integer=False)
        error_var = _error_var(ds, src, n)
        cols = _coordinates(ds, src, n, lonlat, coord_vars)
        index = None
        if state_index or (state_index is None and STATE_INDEX in ds.variables):
            index = _state_index(ds, src, n, n_state)
        kinds, names_of = _kinds(ds, src, n)
        time = read_obs_var(ds, src, TIME, n, integer=False) if TIME in ds.variables else None
        level = read_obs_var(ds, src, LEVEL, n, integer=False) if LEVEL in ds.variables else None
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    coords = np.column_stack(cols) if cols else np.zeros((n, 0))
    obs = ObsSet(values, error_var, coords, kinds.astype(np.int32), vcoord=level)
    return ObsFile(obs, index, attrs, time, names_of)
