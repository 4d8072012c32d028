"""``interpolation = "nearest"``: each observation is the state point nearest its own coordinates
(great-circle on the sphere, around the ring on a periodic metric), H x = x[nearest row]."""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from enkflow.analysis.geometry import lonlat_to_xyz
from enkflow.config import Metric
from enkflow.errors import ConfigError
from enkflow.obs.fileformat import LAT, LON, ObsFile
from enkflow.obs.locating import Location, Target
from enkflow.obs.locators.grid import VariableGrid, coord_vars, read_with_coordinates, spacing, variable_grids
from enkflow.obs.reader import Source
from enkflow.state import StateLayout


class NearestOperator:
    """Observations at the state rows nearest them; the domain reaches half a grid spacing beyond
    the outer points."""

    name = "nearest"

    def read(self, source: Source, layout: StateLayout, metric: Metric | None) -> ObsFile:
        return read_with_coordinates(source, layout, metric, self.name)

    def margin(self, axis: np.ndarray) -> float:
        return 0.5 * spacing(axis)

    def locate(self, of: ObsFile, target: Target) -> Location:
        index = np.zeros(of.obs.coords.shape[0], np.int64)
        for g in variable_grids(of, target, self):
            index[g.sel] = g.rows.start + _nearest(g, target)
        return Location(of.obs.coords, coord_vars(target.metric, target.layout) == (LON, LAT), state_index=index)


def _nearest(g: VariableGrid, target: Target) -> np.ndarray:
    """(k,) int64: for each observation of ``g``, the nearest of the variable's points."""
    period = target.period
    if coord_vars(target.metric, target.layout) == (LON, LAT):
        tree, q = cKDTree(lonlat_to_xyz(g.pts)), lonlat_to_xyz(g.x)
    elif target.metric is Metric.PERIODIC:
        if period is None:
            raise ConfigError("interpolation 'nearest' on the periodic metric needs the ring's length",
                              key="analysis.localization.period")
        tree, q = cKDTree(np.mod(g.pts, period), boxsize=period), np.mod(g.x, period)
    else:
        tree, q = cKDTree(g.pts), g.x
    _, j = tree.query(q, k=1)
    return np.asarray(j, dtype=np.int64).reshape(-1)
