"""Localization coordinates of every state row, from CF attributes or grid indices."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from enkflow.errors import FileFormatError

CoordKind = Literal["lonlat", "index"]

_LON_UNITS = {"degrees_east", "degree_east", "degrees_e", "degree_e", "degreese", "degreee"}
_LAT_UNITS = {"degrees_north", "degree_north", "degrees_n", "degree_n", "degreesn", "degreen"}


def _axis(v: Any) -> str | None:
    """'lon', 'lat' or None for a NetCDF variable, by CF standard_name, units or name."""
    attrs = {k: v.getncattr(k) for k in v.ncattrs()}
    sn = str(attrs.get("standard_name", "")).lower()
    units = str(attrs.get("units", "")).lower().replace(" ", "_")
    name = v.name.lower()
    if sn == "longitude" or units in _LON_UNITS or name in ("lon", "longitude"):
        return "lon"
    if sn == "latitude" or units in _LAT_UNITS or name in ("lat", "latitude"):
        return "lat"
    return None


class CoordAxis(enum.Enum):
    """Which axis a state coordinate is: the observation file's ``x`` (or ``lon``), ``y`` (``lat``) or ``z``."""

    X = "x"
    Y = "y"
    Z = "z"


_VERTICAL_NAMES = {"z", "depth", "height", "altitude", "lev", "level", "plev", "pressure"}
_VERTICAL_SN = {"depth", "height", "altitude", "air_pressure", "model_level_number", "height_above_reference_ellipsoid"}
_PRESSURE_UNITS = {"pa", "hpa", "kpa", "mbar", "millibar", "bar", "dbar", "decibar"}


def coord_axis(v: Any) -> CoordAxis | None:
    """The axis of coordinate variable ``v`` by CF ``axis``, ``positive`` (vertical only), ``standard_name``
    (projection/grid/geographic, vertical), units or name; None where nothing says."""
    attrs = {k: str(v.getncattr(k)) for k in v.ncattrs()}
    axis = attrs.get("axis", "").upper()
    sn = attrs.get("standard_name", "").lower()
    name = v.name.lower()
    if axis == "X" or sn in ("projection_x_coordinate", "grid_longitude") or name == "x":
        return CoordAxis.X
    if axis == "Y" or sn in ("projection_y_coordinate", "grid_latitude") or name == "y":
        return CoordAxis.Y
    parametric = sn.startswith(("ocean_", "atmosphere_")) and sn.endswith("_coordinate")  # CF appendix D
    if (axis == "Z" or "positive" in attrs or sn in _VERTICAL_SN or parametric
            or attrs.get("units", "").lower() in _PRESSURE_UNITS or name in _VERTICAL_NAMES):
        return CoordAxis.Z
    return {"lon": CoordAxis.X, "lat": CoordAxis.Y, None: None}[_axis(v)]


@dataclass(frozen=True, eq=False)
class StateCoords:
    """The localization coordinates of the state rows.

    Attributes
    ----------
    values : (n_rows, n_dim) float64
        Each row's coordinates.
    names : tuple of str, (n_dim,)
        What each column is (coordinate variable names, or ``index:<dim>``).
    axes : tuple of CoordAxis or None, (n_dim,)
        Which axis each column is (None: the file does not say).
    kind : "lonlat" or "index"
    """

    values: np.ndarray
    names: tuple[str, ...]
    axes: tuple[CoordAxis | None, ...]
    kind: CoordKind


def _candidates(ds: Any, var: Any) -> list[str]:
    """Auxiliary coordinates named in ``coordinates``, then the CF coordinate variables of its dims."""
    names = []
    aux = var.getncattr("coordinates") if "coordinates" in var.ncattrs() else ""
    names.extend(str(aux).split())
    names.extend(d for d in var.dimensions if d in ds.variables)
    return [n for n in names if n in ds.variables]


def _values_at(ds: Any, path: str, cname: str, sv: Any, elems: np.ndarray) -> np.ndarray:
    """Value of coordinate variable ``cname`` at the state variable's elements ``elems``."""
    cv = ds.variables[cname]
    cdims = tuple(cv.dimensions)
    if not set(cdims) <= set(sv.dims):
        raise FileFormatError(f"coordinate '{cname}' spans {cdims}, not a subset of the state dims {sv.dims}", path=path, variable=sv.name)
    vals = np.asarray(cv[...], dtype=np.float64)
    if not cdims:
        return np.full(elems.size, float(vals))
    multi = np.unravel_index(elems, sv.shape)
    pos = [multi[sv.dims.index(d)] for d in cdims]
    return vals[tuple(pos)]


def state_coords(
    ds: Any, path: str, svars: Sequence[Any], n_rows: int, names: Sequence[str] | None
) -> StateCoords:
    """The coordinates of the rows of the state variables ``svars``.

    With ``names`` every state variable takes those coordinate variables (kind ``lonlat`` when
    the first two are longitude and latitude, else ``index``). Otherwise each variable takes its
    CF longitude/latitude; if any variable has none, every variable uses grid indices of its
    last two dimensions (x = last, y = second last), or of its only dimension.
    """
    if names is not None:
        for sv in svars:
            for c in names:
                if c not in ds.variables:
                    raise FileFormatError("coordinate variable not in the file", path=path, variable=c)
        kinds = [_axis(ds.variables[c]) for c in names]
        kind: CoordKind = "lonlat" if kinds[:2] == ["lon", "lat"] else "index"
        cols = tuple(names)
        out = np.empty((n_rows, len(cols)), dtype=np.float64)
        for sv in svars:
            el = sv.elements(0, sv.n_rows)
            for j, c in enumerate(cols):
                out[sv.rows, j] = _values_at(ds, path, c, sv, el)
        return StateCoords(out, cols, tuple(coord_axis(ds.variables[c]) for c in cols), kind)

    found: list[tuple[str, str] | None] = []
    for sv in svars:
        lon = lat = None
        for c in _candidates(ds, ds.variables[sv.name]):
            if not set(ds.variables[c].dimensions) <= set(sv.dims):
                continue
            ax = _axis(ds.variables[c])
            if ax == "lon" and lon is None:
                lon = c
            elif ax == "lat" and lat is None:
                lat = c
        found.append((lon, lat) if lon and lat else None)

    pairs = [f for f in found if f is not None]
    if len(pairs) == len(found):
        out = np.empty((n_rows, 2), dtype=np.float64)
        for sv, (lon_name, lat_name) in zip(svars, pairs):
            el = sv.elements(0, sv.n_rows)
            out[sv.rows, 0] = _values_at(ds, path, lon_name, sv, el)
            out[sv.rows, 1] = _values_at(ds, path, lat_name, sv, el)
        return StateCoords(out, pairs[0], (CoordAxis.X, CoordAxis.Y), "lonlat")

    ndims = {min(len(sv.dims), 2) for sv in svars}
    if len(ndims) != 1:
        sv = next(s for s, f in zip(svars, found) if f is None)
        raise FileFormatError(
            "no longitude/latitude found and the state variables have different horizontal ranks; "
            "give state.coordinates", path=path, variable=sv.name,
        )
    nd = ndims.pop()
    out = np.zeros((n_rows, max(nd, 1)), dtype=np.float64)
    for sv in svars:
        if not sv.dims:
            continue
        multi = np.unravel_index(sv.elements(0, sv.n_rows), sv.shape)
        out[sv.rows, 0] = multi[-1]
        if nd == 2:
            out[sv.rows, 1] = multi[-2]
    sv0 = svars[0]
    cols = tuple(f"index:{d}" for d in (sv0.dims[-1:] if nd == 1 else (sv0.dims[-1], sv0.dims[-2])))
    return StateCoords(out, cols, (CoordAxis.X, CoordAxis.Y)[:len(cols)], "index")
