"""The vertical coordinate of every state row, for vertical localization.

``[analysis.localization] vertical_coordinate`` names either a dimension of the state
variables (a row's coordinate is then its index along that dimension: levels) or a
variable of the restart file, on a subset of the state variables' dimensions (e.g.
``pressure(lev)`` or ``z(lev, lat, lon)``: a row's coordinate is its value there).
"""

from __future__ import annotations

import netCDF4
import numpy as np

from enkflow.config import LocalizationConfig
from enkflow.errors import ConfigError
from enkflow.state import StateLayout
from enkflow.state.coords import _values_at

KEY = "analysis.localization.vertical_coordinate"


def row_vertical(layout: StateLayout, name: str) -> np.ndarray:
    """(n_rows,) float64: the vertical coordinate ``name`` of every state row of ``layout``.

    Raises ConfigError (key ``analysis.localization.vertical_coordinate``, naming the template restart)
    where ``name`` is neither a dimension of every state variable nor a variable of the template, and
    FileFormatError where that variable does not fit a state variable's dimensions."""
    out = np.empty(layout.n_rows)
    if all(name in sv.dims for sv in layout.variables):
        for sv in layout.variables:
            multi = np.unravel_index(sv.elements(0, sv.n_rows), sv.shape)
            out[sv.rows] = multi[sv.dims.index(name)]
        return out
    with netCDF4.Dataset(layout.template, "r") as ds:
        if name not in ds.variables:
            lacking = [sv.name for sv in layout.variables if name not in sv.dims]
            why = (f"state variable(s) {', '.join(lacking)} lack that dimension" if len(lacking) < len(layout.variables)
                   else "no state variable has that dimension")
            raise ConfigError(f"vertical localization: vertical coordinate '{name}' is neither a dimension of every "
                              f"state variable ({why}) nor a variable of {layout.template}", key=KEY)
        for sv in layout.variables:
            out[sv.rows] = _values_at(ds, layout.template, name, sv, sv.elements(0, sv.n_rows))
    bad = ~np.isfinite(out)
    if bad.any():
        raise ConfigError(f"vertical coordinate '{name}' of {layout.template} is not finite at state row "
                          f"{int(np.argmax(bad))}", key=KEY)
    return out


def localization_coords(layout: StateLayout, loc: LocalizationConfig | None) -> np.ndarray:
    """The coordinates the local analysis groups rows by: ``layout.coords``, and with vertical
    localization the rows' vertical coordinate as a last column (domains per point and level)."""
    if loc is None or loc.vertical_radius is None or loc.vertical_coordinate is None:
        return layout.coords
    return np.column_stack([layout.coords, row_vertical(layout, loc.vertical_coordinate)])
