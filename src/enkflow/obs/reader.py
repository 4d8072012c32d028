"""Reading an observation file (:mod:`enkflow.obs.fileformat`), whole or a part of its observations
(:class:`ObsPart`): every variable checked as it is read, each error naming the file, the variable, the
cycle the file serves and the observation by its index in the file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.errors import FileFormatError, InputError
from enkflow.obs.fileformat import (ERROR_STD, ERROR_VAR, KIND, LAT, LAT_RANGE, LEVEL, LON, LON_RANGE, OBS_DIM,
                                    STATE_INDEX, TIME, VALUE, ObsFile)


@dataclass(frozen=True)
class ObsPart:
    """Observations ``[start, stop)`` of an observation file's ``obs`` dimension (indices in the file),
    so that a rank reads its share of a file without holding the whole of it."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise InputError(f"an observation part needs 0 <= start <= stop; got [{self.start}, {self.stop})",
                             item="part")

    @property
    def size(self) -> int:
        return self.stop - self.start


def parts_of(n: int, at_most: int) -> list[ObsPart]:
    """``[0, n)`` in consecutive parts of at most ``at_most`` observations (one empty part where n == 0)."""
    if at_most < 1:
        raise InputError(f"a part holds at least one observation; got at_most = {at_most}", item="at_most")
    return [ObsPart(a, min(a + at_most, n)) for a in range(0, max(n, 1), at_most)]


@dataclass(frozen=True)
class Source:
    """The file being read (``given``: its path as the caller gave it), the cycle it serves (named in
    every error), and the part of its observations read (None: all)."""

    given: str | Path
    cycle: int | None = None
    part: ObsPart | None = None

    @property
    def path(self) -> Path:
        return Path(self.given)

    def at(self, i: int) -> int:
        """The index in the file of the ``i``-th observation read (what errors name)."""
        return i + (self.part.start if self.part is not None else 0)

    def fail(self, variable: str | None, message: str) -> FileFormatError:
        where = "" if self.cycle is None else f" (observation file of cycle {self.cycle})"
        return FileFormatError(message + where, path=str(self.path), variable=variable)


def first(bad: np.ndarray) -> int:
    """The index of the first True of ``bad``, (n,) bool."""
    return int(np.argmax(bad))


def read_obs_var(ds: netCDF4.Dataset, src: Source, name: str, rows: slice, *, integer: bool,
                 why: str = "") -> np.ndarray:
    """The observations ``rows`` (file indices) of the variable ``name(obs)``, (n,) with n the rows'
    count: integer as stored, else float64 and finite. Only those rows are read."""
    if name not in ds.variables:
        raise src.fail(name, "variable missing" + (f"; {why}" if why else
                                                   f"; an observation file needs {VALUE} and {ERROR_STD} (or {ERROR_VAR})"))
    var = ds.variables[name]
    if var.dimensions != (OBS_DIM,):
        raise src.fail(name, f"has dimensions {var.dimensions}, expected ('{OBS_DIM}',)")
    if integer and not np.issubdtype(var.dtype, np.integer):
        raise src.fail(name, f"must be an integer variable, has dtype {var.dtype}")
    data = var[rows]
    if np.ma.is_masked(data):
        raise src.fail(name, f"missing value (_FillValue) at index {src.at(first(np.ma.getmaskarray(data)))}")
    a = np.asarray(np.ma.getdata(data))
    n = rows.stop - rows.start
    if a.shape != (n,):
        raise src.fail(name, f"has shape {a.shape}, expected ({n},)")
    if not integer:
        a = a.astype(np.float64, copy=False)
        bad = ~np.isfinite(a)
        if bad.any():
            raise src.fail(name, f"holds NaN or Inf at index {src.at(first(bad))}")
    return a


def _check_range(src: Source, name: str, a: np.ndarray, lo: float, hi: float) -> None:
    bad = (a < lo) | (a > hi)
    if bad.any():
        i = first(bad)
        raise src.fail(name, f"must lie in [{lo:g}, {hi:g}] degrees; index {src.at(i)} has {float(a[i])!r}")


def _flag_names(var: netCDF4.Variable) -> dict[int, str]:
    """Kind code -> name from CF ``flag_values``/``flag_meanings`` (empty where absent or inconsistent)."""
    if "flag_values" not in var.ncattrs() or "flag_meanings" not in var.ncattrs():
        return {}
    codes = np.atleast_1d(var.getncattr("flag_values"))
    names = str(var.getncattr("flag_meanings")).split()
    return {int(c): n for c, n in zip(codes, names)} if len(names) == codes.size else {}


def _error_var(ds: netCDF4.Dataset, src: Source, rows: slice) -> np.ndarray:
    """(n,) error variances of ``rows``: ``error_std**2``, or the file's ``error_var``; all > 0."""
    if ERROR_STD in ds.variables:
        std = read_obs_var(ds, src, ERROR_STD, rows, integer=False)
        err_name, err = ERROR_STD, std
        error_var = std * std
    elif ERROR_VAR in ds.variables:
        err_name = ERROR_VAR
        err = error_var = read_obs_var(ds, src, ERROR_VAR, rows, integer=False)
    else:
        raise src.fail(ERROR_STD, f"variable missing (and no '{ERROR_VAR}' either)")
    if err.size and (err <= 0).any():
        i = first(err <= 0)
        raise src.fail(err_name, f"must be > 0; index {src.at(i)} has {float(err[i])!r}")
    return error_var


def _coordinates(ds: netCDF4.Dataset, src: Source, rows: slice, lonlat: bool,
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
        a = read_obs_var(ds, src, name, rows, integer=False, why=why)
        if checked and name in ranges:
            _check_range(src, name, a, *ranges[name])
        cols.append(a)
    return cols


def _state_index(ds: netCDF4.Dataset, src: Source, rows: slice, n_state: int | None) -> np.ndarray:
    """(n,) int64 ``state_index`` of ``rows``, each in [0, n_state)."""
    index = read_obs_var(ds, src, STATE_INDEX, rows, integer=True,
                         why=f"interpolation 'index' locates observations by {STATE_INDEX} (or set "
                             "observations.interpolation = 'nearest' or 'bilinear' to use their coordinates)"
                         ).astype(np.int64)
    if index.size and index.min() < 0:
        i = first(index < 0)
        raise src.fail(STATE_INDEX, f"must be >= 0; index {src.at(i)} has {index[i]}")
    if n_state is not None and index.size and index.max() >= n_state:
        i = first(index >= n_state)
        raise src.fail(STATE_INDEX, f"must be < n_state = {n_state}; index {src.at(i)} has {index[i]}")
    return index


def _kinds(ds: netCDF4.Dataset, src: Source, rows: slice) -> tuple[np.ndarray, dict[int, str]]:
    """(n,) kind codes of ``rows`` (0 without ``kind``) and the names its flag attributes give them."""
    if KIND not in ds.variables:
        return np.zeros(rows.stop - rows.start, np.int32), {}
    kinds = read_obs_var(ds, src, KIND, rows, integer=True)
    if kinds.size and (kinds.min() < np.iinfo(np.int32).min or kinds.max() > np.iinfo(np.int32).max):
        raise src.fail(KIND, "values do not fit in int32")
    return kinds, _flag_names(ds.variables[KIND])


def _open(src: Source) -> netCDF4.Dataset:
    """The file of ``src`` open for reading, with an ``obs`` dimension."""
    if not src.path.is_file():
        raise src.fail(None, "observation file not found")
    try:
        ds = netCDF4.Dataset(src.path, "r")
    except OSError as exc:
        raise src.fail(None, f"cannot be opened as NetCDF: {exc}") from None
    if OBS_DIM not in ds.dimensions:
        ds.close()
        raise src.fail(None, f"no '{OBS_DIM}' dimension; dimensions are {list(ds.dimensions)}")
    return ds


def obs_count(path: str | Path, cycle: int | None = None) -> int:
    """The number of observations in the file ``path`` (its ``obs`` dimension), without reading any
    variable; FileFormatError (naming the file and ``cycle``) as :func:`read_obs_file` for a missing or
    unreadable file or one without the dimension."""
    with _open(Source(path, cycle)) as ds:
        return len(ds.dimensions[OBS_DIM])


def _rows(src: Source, n: int) -> slice:
    """The file indices ``src`` reads from a file of ``n`` observations (its part must lie within)."""
    part = src.part if src.part is not None else ObsPart(0, n)
    if part.stop > n:
        raise src.fail(None, f"observations [{part.start}, {part.stop}) asked for, but the file has {n} "
                             f"(dimension '{OBS_DIM}')")
    return slice(part.start, part.stop)


def read_obs_file(path: str | Path, *, n_state: int | None = None, lonlat: bool = True,
                  cycle: int | None = None, coord_vars: Sequence[str] | None = None,
                  state_index: bool | None = True, part: ObsPart | None = None) -> ObsFile:
    """Read and validate an observation file, or the observations ``part`` of it.

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
    part : ObsPart, optional
        Read only these observations (slices of each variable): the result holds ``part.size``
        observations, in file order. None: all of them (the same as ``ObsPart(0, n)``).

    Raises
    ------
    FileFormatError
        Naming the file and variable (and the cycle): missing file, variable or
        dimension, wrong shape or type, NaN/Inf, missing values, ``error_std <= 0``,
        ``lon``/``lat`` out of range, ``state_index`` out of range (with the first bad index
        in the file), a ``part`` beyond the file's observations.
    """
    src = Source(Path(path), cycle, part)
    with _open(src) as ds:
        rows = _rows(src, len(ds.dimensions[OBS_DIM]))
        n = rows.stop - rows.start
        values = read_obs_var(ds, src, VALUE, rows, integer=False)
        error_var = _error_var(ds, src, rows)
        cols = _coordinates(ds, src, rows, lonlat, coord_vars)
        index = None
        if state_index or (state_index is None and STATE_INDEX in ds.variables):
            index = _state_index(ds, src, rows, n_state)
        kinds, names_of = _kinds(ds, src, rows)
        time = read_obs_var(ds, src, TIME, rows, integer=False) if TIME in ds.variables else None
        level = read_obs_var(ds, src, LEVEL, rows, integer=False) if LEVEL in ds.variables else None
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    coords = np.column_stack(cols) if cols else np.zeros((n, 0))
    obs = ObsSet(values, error_var, coords, kinds.astype(np.int32), vcoord=level)
    return ObsFile(obs, index, attrs, time, names_of)
