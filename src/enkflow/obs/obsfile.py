"""The observation file: the observations of one analysis time, and where they are.

Layout (``docs/formats.md``, section "Observation file"): one dimension ``obs``
and the variables

* ``value(obs)`` float64 - observed values y;
* ``error_std(obs)`` float64 - observation error standard deviations, > 0,
  same units as ``value`` (R = diag(error_std**2)); a file may hold
  ``error_var(obs)`` (the variances) instead;
* the location, matching the configured observation operator
  (``[observations] interpolation``):

  - ``index``: ``state_index(obs)`` int64, the 0-based state row observed, H(x) = x[state_index];
    the observation sits at that row (no coordinate variable is read);
  - ``nearest`` / ``bilinear``: the observation's own coordinates, matching the metric:
    ``lon(obs)``, ``lat(obs)`` (degrees) for ``sphere``, ``x``, ``y`` (, ``z``) in the state's
    coordinate units for ``cartesian``, ``x`` (the position on the ring) for ``periodic``;
* ``kind(obs)`` int32 - observation kind code (optional, 0 if absent; CF ``flag_values`` /
  ``flag_meanings`` name the codes); ``[observations.kinds.NAME]`` selects per kind the error
  factor, the localization radius, the QC threshold and the observed state variable;
* ``time(obs)`` float64 - optional: the observation time relative to the analysis time, in the
  model's time unit; it must lie in the window (``[observations] window``);
* ``level(obs)`` float64 - optional: the vertical coordinate, for vertical localization.

:func:`load_for_state` is the one place an observation file is checked against a state and
turned into the analysis' :class:`ObsSet` (and H): the analysis calls it, and ``enkflow run`` calls
it for every cycle's file before the first forecast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.errors import ConfigError, FileFormatError, InputError
from enkflow.analysis.obsset import ObsSet
from enkflow.config import LocalizationConfig, Metric
from enkflow.obs.config import Interpolation, ObsSettingsConfig
from enkflow.obs.operators import LinearObsOperator
from enkflow.state import StateLayout

OBS_DIM = "obs"
VALUE = "value"
ERROR_STD = "error_std"
ERROR_VAR = "error_var"
LON = "lon"
LAT = "lat"
X, Y, Z = "x", "y", "z"
STATE_INDEX = "state_index"
KIND = "kind"
TIME = "time"
LEVEL = "level"

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
        Values, error variances (``error_std**2``, times the kind's ``error_factor**2``),
        coordinates, kinds. Read by :func:`read_obs_file`: the coordinate variables read, or
        ``(n_obs, 0)``; from :func:`load_for_state`: the localization coordinates (the observed
        state rows' with ``interpolation = "index"``, the file's own otherwise).
    state_index : (n_obs,) int64 or None
        0-based state row observed by each observation (``index``: the file's; ``nearest``: the
        nearest row); None where ``operator`` interpolates.
    attrs : dict
        The file's global attributes.
    time : (n_obs,) float64 or None
        Observation times relative to the analysis time (model time unit), where the file has them.
    kind_names : dict
        Kind code -> name, from the file's ``flag_values``/``flag_meanings`` and the configuration.
    operator : LinearObsOperator or None
        H where it is not the selection of ``state_index`` (bilinear interpolation).
    qc_sigma : (n_obs,) float64 or None
        Gross-error threshold k per observation (inf: not checked); None: no gross-error check.
    lonlat : bool
        The coordinates are longitude/latitude in degrees.
    """

    obs: ObsSet
    state_index: np.ndarray | None
    attrs: dict[str, Any] = field(default_factory=dict)
    time: np.ndarray | None = None
    kind_names: dict[int, str] = field(default_factory=dict)
    operator: LinearObsOperator | None = None
    qc_sigma: np.ndarray | None = None
    lonlat: bool = False  # the coordinates are (lon, lat) in degrees

    def __post_init__(self) -> None:
        if self.state_index is None:  # located by coordinates: H is known once the state is (load_for_state)
            return
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

    def operator_for(self, n_rows: int) -> LinearObsOperator:
        """H on a state of ``n_rows`` rows: ``operator``, or the selection of ``state_index``."""
        if self.operator is not None:
            return self.operator
        if self.state_index is None:
            raise InputError("observations located by coordinates: read them with load_for_state (H needs the state)",
                             item="state_index")
        return LinearObsOperator.selection(self.state_index, n_rows)

    def kind_name(self, code: int) -> str:
        return self.kind_names.get(int(code), str(int(code)))


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


def _read_obs_var(ds: Any, src: _Source, name: str, n: int, *, integer: bool, why: str = "") -> np.ndarray:
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


def _flag_names(var: Any) -> dict[int, str]:
    """Kind code -> name from CF ``flag_values``/``flag_meanings`` (empty where absent or inconsistent)."""
    if "flag_values" not in var.ncattrs() or "flag_meanings" not in var.ncattrs():
        return {}
    codes = np.atleast_1d(var.getncattr("flag_values"))
    names = str(var.getncattr("flag_meanings")).split()
    return {int(c): n for c, n in zip(codes, names)} if len(names) == codes.size else {}


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
            a = _read_obs_var(ds, src, name, n, integer=False, why=why)
            if checked and name in ranges:
                _check_range(src, name, a, *ranges[name])
            cols.append(a)
        index = None
        if state_index or (state_index is None and STATE_INDEX in ds.variables):
            index = _read_obs_var(ds, src, STATE_INDEX, n, integer=True,
                                  why=f"interpolation 'index' locates observations by {STATE_INDEX} (or set "
                                      "observations.interpolation = 'nearest' or 'bilinear' to use their coordinates)"
                                  ).astype(np.int64)
            if n and index.min() < 0:
                i = _first(index < 0)
                raise src.fail(STATE_INDEX, f"must be >= 0; index {i} has {index[i]}")
            if n_state is not None and n and index.max() >= n_state:
                i = _first(index >= n_state)
                raise src.fail(STATE_INDEX, f"must be < n_state = {n_state}; index {i} has {index[i]}")
        names_of: dict[int, str] = {}
        if KIND in ds.variables:
            kinds = _read_obs_var(ds, src, KIND, n, integer=True)
            if n and (kinds.min() < np.iinfo(np.int32).min or kinds.max() > np.iinfo(np.int32).max):
                raise src.fail(KIND, "values do not fit in int32")
            names_of = _flag_names(ds.variables[KIND])
        else:
            kinds = np.zeros(n, np.int32)
        time = _read_obs_var(ds, src, TIME, n, integer=False) if TIME in ds.variables else None
        level = _read_obs_var(ds, src, LEVEL, n, integer=False) if LEVEL in ds.variables else None
        attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    coords = np.column_stack(cols) if cols else np.zeros((n, 0))
    obs = ObsSet(values, error_var, coords, kinds.astype(np.int32), vcoord=level)
    return ObsFile(obs, index, attrs, time, names_of)


@dataclass(frozen=True)
class ObsSettings:
    """What the analysis needs to turn a file into observations and H: the ``[observations]`` keys,
    the localization (for the kinds' radii) and the time window (relative to the analysis time).

    ``window`` None: times are not checked (a file without ``time`` needs none)."""

    config: ObsSettingsConfig = field(default_factory=ObsSettingsConfig)
    localization: LocalizationConfig | None = None
    window: tuple[float, float] | None = None

    @classmethod
    def from_experiment(cls, cfg: Any) -> "ObsSettings":
        """From an :class:`~enkflow.experiment.config.ExperimentConfig`: window default
        ``[-forecast_length, 0]`` (the forecast that ends at the analysis)."""
        o = cfg.observations
        window = tuple(o.window) if o.window is not None else (-float(cfg.experiment.forecast_length), 0.0)
        loc = cfg.analysis.localization if cfg.analysis is not None else None
        return cls(ObsSettingsConfig.model_validate(o.model_dump(include=set(ObsSettingsConfig.model_fields))),
                   loc, window)  # type: ignore[arg-type]


def _coord_vars(metric: Metric | None, layout: StateLayout) -> tuple[str, ...]:
    """The file's coordinate variables for ``metric`` (global filters: the state's kind of coordinates)."""
    if metric is Metric.SPHERE or (metric is None and layout.coord_kind == "lonlat"):
        return (LON, LAT)
    if metric is Metric.PERIODIC:
        return (X,)
    return (X, Y, Z)[: layout.coords.shape[1]]


@dataclass(frozen=True)
class _Kinds:
    """Per observation: the kind's error factor, localization radius (NaN: the default), gross-error
    threshold (NaN: none) and observed state variable (None: the only one)."""

    factor: np.ndarray
    radius: np.ndarray
    qc_sigma: np.ndarray
    variable: list[str | None]
    names: dict[int, str]


def _kinds(of: ObsFile, cfg: ObsSettingsConfig, src: _Source) -> _Kinds:
    kinds = of.obs.kinds
    n = kinds.size
    by_code = {k.code: name for name, k in cfg.kinds.items() if k.code is not None}
    names = dict(of.kind_names)
    factor, radius, qc = np.ones(n), np.full(n, np.nan), np.full(n, np.nan)
    variable: list[str | None] = [None] * n
    if cfg.qc.gross_sigma is not None:
        qc[:] = cfg.qc.gross_sigma
    for c in np.unique(kinds).tolist():
        name = by_code.get(c)
        if name is None and names.get(c) in cfg.kinds and cfg.kinds[names[c]].code is None:
            name = names[c]
        at = kinds == c
        if name is None:
            if cfg.kinds:
                i = _first(at)
                label = f" ('{names[c]}' in its flag_meanings)" if c in names else ""
                raise src.fail(KIND, (
                    f"kind {c}{label} of observation {i} is not a configured kind; [observations.kinds] has "
                    f"{', '.join(sorted(cfg.kinds))} (a kind is matched by its 'code', or by its name in the "
                    "file's flag_meanings)"))
            continue
        names[c] = name
        k = cfg.kinds[name]
        factor[at] = k.error_factor
        if k.radius is not None:
            radius[at] = k.radius
        if k.qc_sigma is not None:
            qc[at] = k.qc_sigma
        for i in np.flatnonzero(at):
            variable[i] = k.variable
    return _Kinds(factor, radius, qc, variable, names)


def _check_time(of: ObsFile, window: tuple[float, float] | None, src: _Source) -> None:
    if of.time is None or window is None:
        return
    lo, hi = window
    bad = (of.time < lo) | (of.time > hi)
    if bad.any():
        i = _first(bad)
        raise src.fail(TIME, f"observation {i} at time {float(of.time[i])!r} is outside the window [{lo:g}, {hi:g}] "
                             "(relative to the analysis time, model time unit; observations.window)")


def _spacing(a: np.ndarray) -> float:
    d = np.diff(a)
    return float(d.min()) if d.size else 0.0


def _grid_axis(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(axis, position of each value on it)`` for one coordinate of a grid's points. Where the distinct
    values are whole multiples of their smallest spacing (a regular grid with whole rows or columns
    masked out), the axis is the full regular one, so that interpolation never spans a missing column
    (its corners are then outside the state); otherwise the distinct values themselves."""
    u = np.unique(values)
    if u.size > 2:
        d = float(np.diff(u).min())
        k = (u - u[0]) / d
        if d > 0 and np.allclose(k, np.rint(k), rtol=0, atol=1e-6):
            n = int(np.rint(k[-1])) + 1
            if n <= 4 * u.size + 16:  # not a few far-apart values on a fine step
                axis = u[0] + d * np.arange(n)
                axis[np.rint(k).astype(np.int64)] = u  # the points' own values: on a grid point, weight exactly 1
                return axis, np.rint((values - u[0]) / d).astype(np.int64)
    return u, np.searchsorted(u, values)


def _global_lon(lon: np.ndarray) -> bool:
    """Unique ascending longitudes evenly spaced around the whole globe."""
    if lon.size < 2:
        return False
    d = np.diff(lon)
    return bool(np.allclose(d, d[0], rtol=1e-6) and abs(d[0] * lon.size - 360.0) < 1e-6 * 360.0)


def _locate(of: ObsFile, layout: StateLayout, metric: Metric | None, interp: Interpolation, kinds: _Kinds,
            names: tuple[str, ...], period: float | None, src: _Source, cfg_kinds: Mapping[str, Any]
            ) -> tuple[np.ndarray | None, LinearObsOperator | None]:
    """H for observations located by their coordinates: the nearest state rows (returned as the
    state index), or the interpolation operator. Per state variable observed, its rows must be one
    per horizontal location (nearest/bilinear locate horizontally)."""
    from scipy.spatial import cKDTree

    from enkflow.analysis.geometry import lonlat_to_xyz

    oc = of.obs.coords
    n = oc.shape[0]
    sphere = names == (LON, LAT)
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(kinds.variable):
        if v is None:
            if len(layout.variables) != 1:
                kname = kinds.names.get(int(of.obs.kinds[i]))
                key = f"observations.kinds.{kname}.variable" if kname in cfg_kinds else "observations.kinds"
                raise ConfigError(
                    f"the state has variables {', '.join(layout.names)}: interpolation '{interp.value}' needs the "
                    f"variable each observation kind observes (observation {i} of {src.path}, kind "
                    f"{int(of.obs.kinds[i])})", key=key)
            v = layout.names[0]
        elif v not in layout.names:
            raise ConfigError(f"'{v}' is not a state variable (state: {', '.join(layout.names)})",
                              key=f"observations.kinds.{kinds.names.get(int(of.obs.kinds[i]))}.variable")
        groups.setdefault(v, []).append(i)
    index = np.zeros(n, np.int64)
    trip_r, trip_c, trip_w = [], [], []
    where = ", ".join(names)
    for v, members in groups.items():
        sel = np.asarray(members, dtype=np.int64)
        rows = layout.variable(v).rows
        pts = layout.coords[rows]
        axes, pos = zip(*(_grid_axis(pts[:, k]) for k in range(pts.shape[1])))
        if np.unique(pts, axis=0).shape[0] != pts.shape[0]:
            raise ConfigError(
                f"state variable '{v}' has several rows at one location (levels?); interpolation "
                f"'{interp.value}' locates observations horizontally: use interpolation = 'index' (state_index)",
                key="observations.interpolation")
        x = oc[sel].copy()
        periods: list[float | None] = [None] * x.shape[1]
        if sphere and _global_lon(axes[0]):
            periods[0] = 360.0
        elif sphere:  # a regional grid: the observations' longitudes in the grid's 360 degrees
            x[:, 0] = axes[0][0] + np.mod(x[:, 0] - axes[0][0], 360.0)
        if metric is Metric.PERIODIC:
            periods[0] = period
        # The domain: the grid's extent, half a spacing beyond its outer points (nearest), or its extent (bilinear).
        for k, (a, per) in enumerate(zip(axes, periods)):
            if per is not None:
                if metric is Metric.PERIODIC:
                    bad = (x[:, k] < 0) | (x[:, k] >= per)
                    lo, hi = 0.0, per
                else:
                    continue
            else:
                h = 0.5 * _spacing(a) if interp is Interpolation.NEAREST else 0.0
                lo, hi = a[0] - h, a[-1] + h
                bad = (x[:, k] < lo) | (x[:, k] > hi)
            if bad.any():
                j = int(sel[_first(bad)])
                raise src.fail(names[k], (
                    f"observation {j} at ({', '.join(f'{c:g}' for c in oc[j])}) is outside the domain of state "
                    f"variable '{v}': {names[k]} must lie in [{lo:g}, {hi:g}] (interpolation '{interp.value}')"))
        if interp is Interpolation.NEAREST:
            if sphere:
                tree, q = cKDTree(lonlat_to_xyz(pts)), lonlat_to_xyz(x)
            elif metric is Metric.PERIODIC:
                tree, q = cKDTree(np.mod(pts, period), boxsize=period), np.mod(x, period)
            else:
                tree, q = cKDTree(pts), x
            _, j = tree.query(q, k=1)
            index[sel] = rows.start + np.asarray(j, dtype=np.int64).reshape(-1)
            trip_r.append(sel)
            trip_c.append(index[sel])
            trip_w.append(np.ones(sel.size))
        else:
            if len(axes) > 2:
                raise ConfigError(f"bilinear interpolation takes 1 or 2 horizontal coordinates; the state has "
                                  f"{len(axes)} ({', '.join(layout.coord_names)})", key="observations.interpolation")
            if len(axes) == 1:
                row_of_cell = np.full(axes[0].size, -1, np.int64)
                row_of_cell[pos[0]] = np.arange(rows.start, rows.stop)
            else:
                row_of_cell = np.full((axes[1].size, axes[0].size), -1, np.int64)
                row_of_cell[pos[1], pos[0]] = np.arange(rows.start, rows.stop)
            try:
                H = LinearObsOperator.rectilinear(axes, row_of_cell, x, layout.n_rows, periods).H.tocoo()
            except InputError as exc:
                j = int(sel[exc.index]) if isinstance(exc.index, int) else -1
                raise src.fail(where, f"observation {j} at ({', '.join(f'{c:g}' for c in oc[j])}) is outside the domain "
                                      f"of state variable '{v}' (interpolation 'bilinear': {exc})") from None
            trip_r.append(sel[H.row])
            trip_c.append(H.col)
            trip_w.append(H.data)
    if interp is Interpolation.NEAREST:
        return index, None
    import scipy.sparse as sp

    r = np.concatenate(trip_r) if trip_r else np.zeros(0, np.int64)
    c = np.concatenate(trip_c) if trip_c else np.zeros(0, np.int64)
    w = np.concatenate(trip_w) if trip_w else np.zeros(0)
    return None, LinearObsOperator(sp.csr_matrix((w, (r, c)), shape=(n, layout.n_rows)))


def _vertical(of: ObsFile, layout: StateLayout, loc: LocalizationConfig | None, state_index: np.ndarray | None,
              src: _Source) -> np.ndarray | None:
    """The observations' vertical coordinate where vertical localization is configured: the file's
    ``level``, or (located by state_index) the observed rows'; it must lie within the state's."""
    if loc is None or loc.vertical_radius is None:
        return of.obs.vcoord
    from enkflow.obs.vertical import row_vertical

    rz = row_vertical(layout, loc.vertical_coordinate)
    z = of.obs.vcoord
    if z is None:
        if state_index is None or of.state_index is None:
            raise src.fail(LEVEL, "variable missing; vertical localization (analysis.localization.vertical_radius) "
                                  f"needs each observation's vertical coordinate ({loc.vertical_coordinate}) in "
                                  f"'{LEVEL}' where observations are located by their coordinates")
        return rz[state_index]
    if z.size:
        lo, hi = float(rz.min()), float(rz.max())
        bad = (z < lo) | (z > hi)
        if bad.any():
            i = _first(bad)
            raise src.fail(LEVEL, f"observation {i} at level {float(z[i])!r} is outside the state's vertical "
                                  f"coordinate {loc.vertical_coordinate} range [{lo:g}, {hi:g}]")
    return z


def load_for_state(path: str | Path, layout: StateLayout, metric: Metric | None, *,
                   cycle: int | None = None, settings: ObsSettings | None = None) -> ObsFile:
    """Read ``path`` and check it against the state ``layout``, the analysis ``metric`` and the
    observation ``settings`` (interpolation, kinds, window; default: ``index``, no kinds, no window).

    Every check of an observation file that needs no forecast: the file's own
    (:func:`read_obs_file`: NaN/Inf, ``error_std <= 0``, ``state_index`` outside the
    state's rows, lon/lat ranges), the metric against the coordinates the state has, the
    kinds against ``[observations.kinds]``, the times against the window, and the observations'
    locations (inside the domain). The analysis and ``enkflow run``'s pre-flight check both call it.

    Parameters
    ----------
    layout : StateLayout
        The state the observations observe (from the template restart).
    metric : Metric or None
        The localization metric (``None``: a global analysis, no distances).
    cycle : int, optional
        The cycle the file serves; named in every error.
    settings : ObsSettings, optional

    Returns
    -------
    ObsFile
        ``.obs``: values, error variances (times the kinds' ``error_factor**2``), kinds, localization
        coordinates (n_obs, n_dim) in the metric's units - ``index``: the observed state rows'
        (``layout.coords[state_index]``); ``nearest``/``bilinear``: the file's own - and per-kind
        half-widths; ``.state_index`` (``index``/``nearest``); ``.operator`` (``bilinear``);
        ``.qc_sigma``; ``.time``; ``.attrs``.

    Raises
    ------
    FileFormatError
        Naming the observation file (or, for the state's coordinates, the template
        restart), the variable, the cycle and the first bad index.
    ConfigError
        Key ``analysis.localization.metric``: the sphere metric with a state whose
        coordinates are not longitude/latitude; ``observations.kinds...``: a kind's variable.
    """
    settings = settings or ObsSettings()
    cfg = settings.config
    interp = cfg.interpolation
    sphere = metric is Metric.SPHERE
    if sphere and layout.coord_kind != "lonlat":
        raise ConfigError(
            f"the sphere metric needs longitude/latitude coordinates; the state of {layout.template} has "
            f"{', '.join(layout.coord_names)} (set state.coordinates, or use metric 'cartesian')",
            key="analysis.localization.metric",
        )
    src = _Source(Path(path), cycle)
    period = settings.localization.period if settings.localization is not None else None
    if interp is Interpolation.INDEX:
        of = read_obs_file(path, n_state=layout.n_rows, cycle=cycle, coord_vars=())
    else:
        names = _coord_vars(metric, layout)
        of = read_obs_file(path, cycle=cycle, coord_vars=names, state_index=False)
    kinds = _kinds(of, cfg, src)
    _check_time(of, settings.window, src)
    operator = None
    if interp is Interpolation.INDEX:
        state_index = of.state_index
        coords = layout.coords[state_index]
        if sphere:
            # The observations take the state's coordinates: those must be on the globe too.
            tsrc = _Source(Path(layout.template), cycle)
            for col, (lo, hi) in ((0, LON_RANGE), (1, LAT_RANGE)):
                bad = (coords[:, col] < lo) | (coords[:, col] > hi) | ~np.isfinite(coords[:, col])
                if bad.any():
                    i = _first(bad)
                    raise tsrc.fail(layout.coord_names[col], (
                        f"state coordinate must lie in [{lo:g}, {hi:g}] degrees for the sphere metric; observation {i} "
                        f"of {path} (state_index {state_index[i]}) is at {float(coords[i, col])!r}"))
    else:
        state_index, operator = _locate(of, layout, metric, interp, kinds, names, period, src, cfg.kinds)
        coords = of.obs.coords
    half_width = None
    if np.isfinite(kinds.radius).any():
        from enkflow.analysis import taper as _taper

        loc = settings.localization
        if loc is None:
            raise ConfigError("an observation kind has a localization radius, but the analysis has no "
                              "[analysis.localization]", key="observations.kinds")
        r = np.where(np.isfinite(kinds.radius), kinds.radius, loc.radius)
        half_width = np.array([_taper.half_width(float(v), loc.convention) for v in r]) if r.size else r
    qc_sigma = None
    if np.isfinite(kinds.qc_sigma).any():
        qc_sigma = np.where(np.isfinite(kinds.qc_sigma), kinds.qc_sigma, np.inf)
    vcoord = _vertical(of, layout, settings.localization, state_index, src)
    obs = ObsSet(of.obs.values, of.obs.error_var * kinds.factor**2, coords, of.obs.kinds, half_width, vcoord)
    lonlat = layout.coord_kind == "lonlat" if interp is Interpolation.INDEX else names == (LON, LAT)
    return ObsFile(obs, state_index, of.attrs, of.time, kinds.names, operator, qc_sigma, lonlat)


def write_obs_file(
    path: str | Path,
    data: ObsFile,
    *,
    format: str = "NETCDF4",
    units: str = "1",
    kind_names: Sequence[str] | None = None,
    coord_names: Sequence[str] = (LON, LAT),
) -> None:
    """Write ``data`` as an observation file at ``path`` (overwriting it, not atomically).

    Parameters
    ----------
    data : ObsFile
        ``data.obs.coords`` (n_obs, len(coord_names)): lon, lat in degrees by default.
        ``data.attrs`` become global attributes; ``state_index``, ``time`` and ``obs.vcoord``
        (as ``level``) are written where not None.
    format : str
        netCDF4-python format name, one of :data:`WRITABLE_FORMATS`.
    units : str
        Units of ``value`` and ``error_std`` (CF/UDUNITS string).
    kind_names : sequence of str, optional
        Names of kind codes 0, 1, ...; written as CF ``flag_values``/``flag_meanings``.
    coord_names : sequence of str
        The coordinate variables: ``("lon", "lat")``, or ``("x",)``, ``("x", "y")``, ``("x", "y", "z")``.
    """
    import netCDF4

    if format not in WRITABLE_FORMATS:
        raise InputError(f"format {format!r} cannot hold int64 state_index; use one of {', '.join(WRITABLE_FORMATS)}", item="format")
    obs = data.obs
    if obs.coords.shape[1] != len(coord_names):
        raise InputError(f"obs.coords has {obs.coords.shape[1]} columns, expected {len(coord_names)} "
                         f"({', '.join(coord_names)})", item="obs.coords")
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
        cattrs = {LON: {"standard_name": "longitude", "long_name": "observation longitude", "units": "degrees_east"},
                  LAT: {"standard_name": "latitude", "long_name": "observation latitude", "units": "degrees_north"}}
        for k, name in enumerate(coord_names):
            var(name, "f8", obs.coords[:, k], cattrs.get(name, {"long_name": f"observation coordinate {name}",
                                                                 "units": "1"}))
        if data.state_index is not None:
            var(STATE_INDEX, "i8", data.state_index, {"long_name": "0-based state-vector row observed (H selects it)",
                                                      "units": "1"})
        if data.time is not None:
            var(TIME, "f8", data.time, {"long_name": "observation time relative to the analysis time",
                                        "units": "model time unit"})
        if obs.vcoord is not None:
            var(LEVEL, "f8", obs.vcoord, {"long_name": "observation vertical coordinate", "units": "1"})
        kind_attrs: dict[str, Any] = {"long_name": "observation kind code"}
        if kind_names:
            kind_attrs["flag_values"] = np.arange(len(kind_names), dtype=np.int32)
            kind_attrs["flag_meanings"] = " ".join(kind_names)
        var(KIND, "i4", obs.kinds, kind_attrs)
        ds.setncatts(dict(data.attrs))
