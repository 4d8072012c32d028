"""``interpolation = "bilinear"``: H interpolates the state linearly (one coordinate) or bilinearly
(two) on each observed variable's rectilinear grid, from the observation's own coordinates."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from enkflow.config import Metric
from enkflow.errors import ConfigError, InputError
from enkflow.obs.fileformat import LAT, LON, ObsFile
from enkflow.obs.locating import Location, Target
from enkflow.obs.locators.grid import VariableGrid, coord_vars, outside, read_with_coordinates, variable_grids
from enkflow.obs.operators import LinearObsOperator
from enkflow.obs.reader import Source
from enkflow.state import StateLayout


class BilinearOperator:
    """Sparse H of interpolation weights; the domain is the grid's extent, and masked grid points
    drop out (:meth:`LinearObsOperator.rectilinear`)."""

    name = "bilinear"

    def read(self, source: Source, layout: StateLayout, metric: Metric | None) -> ObsFile:
        return read_with_coordinates(source, layout, metric, self.name)

    def margin(self, axis: np.ndarray) -> float:
        return 0.0

    def locate(self, of: ObsFile, target: Target) -> Location:
        n, n_rows = of.obs.coords.shape[0], target.layout.n_rows
        trip_r, trip_c, trip_w = [], [], []
        for g in variable_grids(of, target, self):
            H = self._weights(of, target, g)
            trip_r.append(g.sel[H.row])
            trip_c.append(H.col)
            trip_w.append(H.data)
        r = np.concatenate(trip_r) if trip_r else np.zeros(0, np.int64)
        c = np.concatenate(trip_c) if trip_c else np.zeros(0, np.int64)
        w = np.concatenate(trip_w) if trip_w else np.zeros(0)
        H = LinearObsOperator(sp.csr_matrix((w, (r, c)), shape=(n, n_rows)))
        return Location(of.obs.coords, coord_vars(target.metric, target.layout) == (LON, LAT), operator=H)

    def _weights(self, of: ObsFile, target: Target, g: VariableGrid) -> sp.coo_matrix:
        """H of the observations of ``g`` (k, n_rows), rows numbered within ``g``."""
        layout = target.layout
        if len(g.axes) > 2:
            raise ConfigError(f"bilinear interpolation takes 1 or 2 horizontal coordinates; the state has "
                              f"{len(g.axes)} ({', '.join(layout.coord_names)})", key="observations.interpolation")
        cells = np.arange(g.rows.start, g.rows.stop)
        if len(g.axes) == 1:
            row_of_cell = np.full(g.axes[0].size, -1, np.int64)
            row_of_cell[g.pos[0]] = cells
        else:
            row_of_cell = np.full((g.axes[1].size, g.axes[0].size), -1, np.int64)
            row_of_cell[g.pos[1], g.pos[0]] = cells
        try:
            return LinearObsOperator.rectilinear(g.axes, row_of_cell, g.x, layout.n_rows, g.periods).H.tocoo()
        except InputError as exc:
            if not isinstance(exc.index, int):
                raise
            raise target.source.fail(", ".join(coord_vars(target.metric, layout)), (
                f"{outside(of, target, int(g.sel[exc.index]), g.variable)} (interpolation '{self.name}': {exc})"
            )) from None
