"""``interpolation = "index"``: the file names the state row each observation observes,
H x = x[state_index]; the observation sits at that row and takes its coordinates."""

from __future__ import annotations

import numpy as np

from enkflow.config import Metric
from enkflow.errors import InputError
from enkflow.obs.fileformat import LAT_RANGE, LON_RANGE, STATE_INDEX, ObsFile
from enkflow.obs.locating import Location, Target
from enkflow.obs.reader import Source, first, read_obs_file
from enkflow.state import StateLayout


class IndexOperator:
    """Observations at the state rows of the file's ``state_index``; no coordinate variable is read."""

    name = "index"

    def read(self, source: Source, layout: StateLayout, metric: Metric | None) -> ObsFile:
        return read_obs_file(source.given, n_state=layout.n_rows, cycle=source.cycle, coord_vars=(), part=source.part)

    def locate(self, of: ObsFile, target: Target) -> Location:
        if of.state_index is None:
            raise InputError(f"interpolation '{self.name}' needs the file's {STATE_INDEX}", item=STATE_INDEX)
        layout = target.layout
        coords = layout.coords[of.state_index]
        if target.metric is Metric.SPHERE:
            _check_on_globe(coords, of.state_index, target)
        return Location(coords, layout.coord_kind == "lonlat", state_index=of.state_index, site_rows=of.state_index)


def _check_on_globe(coords: np.ndarray, state_index: np.ndarray, target: Target) -> None:
    """The observations take the state's coordinates, (n_obs, 2) lon/lat: those must be on the globe
    too (FileFormatError naming the template restart and its coordinate variable)."""
    layout = target.layout
    template = Source(layout.template, target.source.cycle)
    for col, (lo, hi) in ((0, LON_RANGE), (1, LAT_RANGE)):
        bad = (coords[:, col] < lo) | (coords[:, col] > hi) | ~np.isfinite(coords[:, col])
        if bad.any():
            i = first(bad)
            raise template.fail(layout.coord_names[col], (
                f"state coordinate must lie in [{lo:g}, {hi:g}] degrees for the sphere metric; observation "
                f"{target.source.at(i)} of {target.source.given} (state_index {state_index[i]}) is at "
                f"{float(coords[i, col])!r}"))
