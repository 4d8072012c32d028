"""Observations located by their own coordinates on the state's grid: what ``nearest`` and
``bilinear`` share. The file holds each observation's coordinates (the metric's); the observations
are grouped by the state variable they observe, whose rows must be one per horizontal location, and
each must lie inside that variable's grid."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from enkflow.config import Metric
from enkflow.errors import ConfigError
from enkflow.obs.fileformat import LAT, LON, X, Y, Z, ObsFile
from enkflow.obs.locating import Target
from enkflow.obs.reader import Source, first, read_obs_file
from enkflow.state import CoordAxis, StateLayout


def coord_vars(metric: Metric | None, layout: StateLayout) -> tuple[str, ...]:
    """The file's coordinate variables for ``metric`` (global filters: the state's kind of coordinates)."""
    if metric is Metric.SPHERE or (metric is None and layout.coord_kind == "lonlat"):
        return (LON, LAT)
    if metric is Metric.PERIODIC:
        return (X,)
    return (X, Y, Z)[: layout.coords.shape[1]]


def check_axis_order(source: Source, layout: StateLayout, metric: Metric | None, operator: str) -> None:
    """Refuse state coordinates whose axes are out of x, y, z order (ConfigError on ``state.coordinates``).

    The state's k-th coordinate is compared with the file's k-th coordinate variable (x, y, z or lon, lat),
    so [y, x] would transpose every observation (silently on a square domain) and [x, depth, y] would
    compare the observations' y with depth. Columns whose axis the template does not say are not moved.
    """
    rank = {CoordAxis.X: 0, CoordAxis.Y: 1, CoordAxis.Z: 2}
    known = [(k, a) for k, a in enumerate(layout.coord_axes) if a is not None]
    ordered = sorted(known, key=lambda ka: rank[ka[1]])
    if [a for _, a in known] == [a for _, a in ordered]:
        return
    (i, ai), (j, aj) = next((p, q) for p, q in zip(known, known[1:]) if rank[p[1]] > rank[q[1]])
    names = layout.coord_names
    order = list(names)
    for (k, _), (moved, _) in zip(known, ordered):
        order[k] = names[moved]
    cycle = "" if source.cycle is None else f" (cycle {source.cycle})"
    raise ConfigError(
        f"state.coordinates {list(names)} list '{names[i]}' (the {ai.value} axis) before '{names[j]}' (the "
        f"{aj.value} axis), but interpolation '{operator}' locates the observations of {source.path}{cycle} by "
        f"their coordinates, which are compared in order with the file's {', '.join(coord_vars(metric, layout))}: "
        f"list them as {order}", key="state.coordinates")


def read_with_coordinates(source: Source, layout: StateLayout, metric: Metric | None, operator: str) -> ObsFile:
    """The file with the coordinate variables of ``metric`` (required), without ``state_index``, once the
    state's coordinates are known to be in the file's order (:func:`check_axis_order`; ``operator``: the
    operator's name, for its error)."""
    check_axis_order(source, layout, metric, operator)
    return read_obs_file(source.given, cycle=source.cycle, coord_vars=coord_vars(metric, layout), state_index=False,
                         part=source.part)


def spacing(a: np.ndarray) -> float:
    """The smallest spacing of the ascending axis ``a`` (0 for a single point)."""
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


class GridOperator(Protocol):
    """An operator that locates observations on the grid: its ``name`` (named in errors), and how far
    beyond the grid's outer points an observation may lie."""

    name: str

    def margin(self, axis: np.ndarray) -> float:
        """The distance beyond the outer points of ``axis`` (ascending, its units) still inside the domain."""
        ...


@dataclass(frozen=True, eq=False)
class VariableGrid:
    """The observations of one state variable, on that variable's grid.

    Attributes
    ----------
    variable : str
        The state variable.
    sel : (k,) int64
        The observations (indices into the file's).
    rows : slice
        The variable's state rows.
    pts : (n_pts, n_dim) float64
        The coordinates of its rows.
    axes, pos : lists of (n_k,) float64 and (n_pts,) int64
        Per coordinate, the grid axis and each row's position on it (:func:`_grid_axis`).
    x : (k, n_dim) float64
        The observations' coordinates; on a regional lon-lat grid, longitudes within the grid's 360 degrees.
    periods : list of float or None
        Per coordinate, its period (360 for a global longitude, the ring length) or None.
    """

    variable: str
    sel: np.ndarray
    rows: slice
    pts: np.ndarray
    axes: list[np.ndarray]
    pos: list[np.ndarray]
    x: np.ndarray
    periods: list[float | None]


def _by_variable(of: ObsFile, target: Target, name: str) -> dict[str, np.ndarray]:
    """State variable -> its observations (ascending (k,) int64), the variables in the order the
    observations first name them; ConfigError where a variable is not known (``name``: the operator's)."""
    layout, kinds = target.layout, of.obs.kinds
    observed = np.array(target.variable, dtype=object)
    groups: dict[str, np.ndarray] = {}
    # Per distinct variable, in the order of first appearance: the first bad observation is found first.
    for v in dict.fromkeys(target.variable):
        at = observed == v
        i = first(at)
        if v is None:
            if len(layout.variables) != 1:
                kname = target.kind_names.get(int(kinds[i]))
                key = f"observations.kinds.{kname}.variable" if kname in target.configured_kinds else "observations.kinds"
                raise ConfigError(
                    f"the state has variables {', '.join(layout.names)}: interpolation '{name}' needs the "
                    f"variable each observation kind observes (observation {target.source.at(i)} of "
                    f"{target.source.path}, kind {int(kinds[i])})", key=key)
            v = layout.names[0]
        elif v not in layout.names:
            raise ConfigError(f"'{v}' is not a state variable (state: {', '.join(layout.names)})",
                              key=f"observations.kinds.{target.kind_names.get(int(kinds[i]))}.variable")
        groups[v] = at | groups[v] if v in groups else at
    return {v: np.flatnonzero(at) for v, at in groups.items()}


def _variable_grid(of: ObsFile, target: Target, name: str, v: str, sel: np.ndarray) -> VariableGrid:
    """The observations ``sel`` ((k,) int64) of state variable ``v`` on its grid (ConfigError where the
    variable has several rows at one location)."""
    layout, metric = target.layout, target.metric
    rows = layout.variable(v).rows
    pts = layout.coords[rows]
    axes, pos = (list(t) for t in zip(*(_grid_axis(pts[:, k]) for k in range(pts.shape[1]))))
    if np.unique(pts, axis=0).shape[0] != pts.shape[0]:
        raise ConfigError(
            f"state variable '{v}' has several rows at one location (levels?); interpolation "
            f"'{name}' locates observations horizontally: use interpolation = 'index' (state_index)",
            key="observations.interpolation")
    x = of.obs.coords[sel].copy()
    sphere = coord_vars(metric, layout) == (LON, LAT)
    periods: list[float | None] = [None] * x.shape[1]
    if sphere and _global_lon(axes[0]):
        periods[0] = 360.0
    elif sphere:  # a regional grid: the observations' longitudes in the grid's 360 degrees
        x[:, 0] = axes[0][0] + np.mod(x[:, 0] - axes[0][0], 360.0)
    if metric is Metric.PERIODIC:
        periods[0] = target.period
    return VariableGrid(v, sel, rows, pts, axes, pos, x, periods)


def outside(of: ObsFile, target: Target, j: int, variable: str) -> str:
    """That the ``j``-th observation read (named by its index in the file) is outside the domain of
    state ``variable``, with its coordinates."""
    at = ", ".join(f"{c:g}" for c in of.obs.coords[j])
    return f"observation {target.source.at(j)} at ({at}) is outside the domain of state variable '{variable}'"


def _check_domain(of: ObsFile, target: Target, op: GridOperator, g: VariableGrid) -> None:
    """Every observation of ``g`` inside the domain: the grid's extent and ``op.margin(axis)`` beyond
    its outer points, the ring on a periodic metric (FileFormatError naming the coordinate)."""
    names = coord_vars(target.metric, target.layout)
    for k, (a, per) in enumerate(zip(g.axes, g.periods)):
        if per is not None:
            if target.metric is Metric.PERIODIC:
                bad = (g.x[:, k] < 0) | (g.x[:, k] >= per)
                lo, hi = 0.0, per
            else:
                continue
        else:
            h = op.margin(a)
            lo, hi = a[0] - h, a[-1] + h
            bad = (g.x[:, k] < lo) | (g.x[:, k] > hi)
        if bad.any():
            raise target.source.fail(names[k], (
                f"{outside(of, target, int(g.sel[first(bad)]), g.variable)}: {names[k]} must lie in "
                f"[{lo:g}, {hi:g}] (interpolation '{op.name}')"))


def variable_grids(of: ObsFile, target: Target, op: GridOperator) -> Iterator[VariableGrid]:
    """The observations of ``of`` by the state variable they observe, each group checked on its grid
    (one location per row, the observations inside the domain) as it is yielded."""
    for v, members in _by_variable(of, target, op.name).items():
        g = _variable_grid(of, target, op.name, v, members)
        _check_domain(of, target, op, g)
        yield g
