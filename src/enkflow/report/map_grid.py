"""Where a state variable's values lie, for the report's maps: its coordinates in the state's own terms
(``[state] coordinates`` of the run, else the variable's CF coordinates: longitude/latitude, or the 1-D
coordinate variables of its last two dimensions), with their names and units."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import netCDF4
import numpy as np


@dataclass(frozen=True)
class CoordAxis:
    """One map axis: the coordinate's values and its label ``long name [units]``."""

    values: np.ndarray
    label: str
    units: str


@dataclass(frozen=True)
class MapGrid:
    """The horizontal (``x``) and vertical (``y``) coordinate of a variable's values. ``gridded``: ``x`` and
    ``y`` are the 1-D axes of the values' last two dimensions (``(..., y, x)``); else each holds every
    value's own coordinate, in the values' shape (points, or a curvilinear grid)."""

    x: CoordAxis
    y: CoordAxis
    gridded: bool

    @property
    def same_units(self) -> bool:
        """Whether both axes are in one unit (or are longitude and latitude): the map keeps its aspect."""
        degrees = self.x.units.startswith("degree") and self.y.units.startswith("degree")
        return degrees or (self.x.units != "" and self.x.units == self.y.units)


def _axis(var: netCDF4.Variable) -> CoordAxis:
    units = str(getattr(var, "units", ""))
    name = str(getattr(var, "long_name", "") or getattr(var, "standard_name", "") or var.name)
    label = f"{name} [{units}]" if units else f"{name} (no units attribute)"
    return CoordAxis(np.asarray(var[:], float), label, units)


class _Horizontal(Enum):
    """The map's two axes: east-west and north-south (or a projection's x and y)."""

    X = "X"
    Y = "Y"


_STANDARD_NAMES = {_Horizontal.X: {"longitude", "grid_longitude", "projection_x_coordinate"},
                   _Horizontal.Y: {"latitude", "grid_latitude", "projection_y_coordinate"}}
_UNITS = {_Horizontal.X: {"degrees_east", "degree_east", "degrees_e", "degree_e"},  # CF's longitude units
          _Horizontal.Y: {"degrees_north", "degree_north", "degrees_n", "degree_n"}}
_NAMES = {_Horizontal.X: {"lon", "longitude", "nav_lon", "x"}, _Horizontal.Y: {"lat", "latitude", "nav_lat", "y"}}


def _is(var: netCDF4.Variable, axis: _Horizontal) -> bool:
    """Whether ``var`` is the map's ``axis`` coordinate: by its CF ``standard_name``, ``axis`` or ``units`` first;
    by its whole name (``lon``, ``longitude``, ``x``, ...) only where it has neither a standard name nor an axis
    (a part of a name, such as ``lon`` in ``along_track``, says nothing)."""
    sn, ax = str(getattr(var, "standard_name", "")), str(getattr(var, "axis", "")).upper()
    if sn in _STANDARD_NAMES[axis] or ax == axis.value or str(getattr(var, "units", "")).lower() in _UNITS[axis]:
        return True
    return not sn and not ax and var.name.lower() in _NAMES[axis]


def _pair(ds: netCDF4.Dataset, v: netCDF4.Variable, coordinates: list[str] | None) -> tuple[str, str] | None:
    """The names of the horizontal and vertical coordinate of ``v``."""
    if coordinates and len(coordinates) >= 2 and all(c in ds.variables for c in coordinates[:2]):
        return coordinates[0], coordinates[1]
    cands = [c for c in str(getattr(v, "coordinates", "")).split() + list(v.dimensions)
             if c in ds.variables and c != v.name]
    lon = next((c for c in cands if _is(ds.variables[c], _Horizontal.X)), None)
    lat = next((c for c in cands if _is(ds.variables[c], _Horizontal.Y)), None)
    if lon is not None and lat is not None:
        return lon, lat
    if v.ndim >= 2 and v.dimensions[-1] in ds.variables and v.dimensions[-2] in ds.variables:
        return v.dimensions[-1], v.dimensions[-2]
    return None


def map_grid(path: Path, name: str, coordinates: list[str] | None) -> MapGrid | None:
    """The coordinates of variable ``name`` of ``path`` (``coordinates``: the run's ``[state] coordinates``,
    horizontal first); None where the file has none that fit the variable's shape."""
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        pair = _pair(ds, v, coordinates)
        if pair is None:
            return None
        x, y = _axis(ds.variables[pair[0]]), _axis(ds.variables[pair[1]])
        shape = v.shape
    if x.values.ndim == 1 and y.values.ndim == 1 and len(shape) >= 2 and shape[-2:] == (y.values.size, x.values.size):
        return MapGrid(x, y, gridded=True)
    if x.values.shape == y.values.shape and x.values.size == int(np.prod(shape)):
        return MapGrid(x, y, gridded=False)
    return None
