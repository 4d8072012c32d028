"""Which rank owns an observation, and which ranks' local domains can see it.

An observation is *owned* by the rank whose I/O row block holds the lowest state row of its H row (the
owner computes its H(x), its quality control and its statistics). A rank *holds* an observation for its
local analyses when one of its domains lies within the blocked local search's reach of it
(:meth:`enkflow.analysis.geometry.Geometry.search_reach` of the cycle's localization support): then
every observation the search weighs, and every candidate it counts to cut its work into parts, is
held, so each part, each batch of domains and each domain's list of observations is today's. The
vertical taper and the kinds' own smaller radii are not used to choose (a superset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from enkflow.analysis.geometry import Geometry
from enkflow.analysis.localization import Localization

#: Relative slack on the support when choosing holders: a superset where rounding could tip a boundary case.
SLACK = 1e-6


def owners(first_row: np.ndarray, io_bounds: np.ndarray) -> np.ndarray:
    """The rank (n,) int64 whose block of ``io_bounds`` (P + 1,) holds each state row ``first_row`` (n,)."""
    return np.searchsorted(np.asarray(io_bounds, dtype=np.int64), first_row, side="right") - 1


class DomainRegions:
    """The horizontal locations of every rank's local domains: rank ``p`` analyses the rows
    ``bounds[p]:bounds[p+1]`` whose localization coordinates are ``row_coords`` (n_rows, n_dim; with
    vertical localization the vertical coordinate last, not used here)."""

    def __init__(self, loc: Localization, row_coords: np.ndarray, bounds: Sequence[int]):
        h = loc.horizontal(row_coords)[0]
        b = np.asarray(bounds, dtype=np.int64)
        self._geometries = [Geometry(loc.metric, h[b[p]:b[p + 1]], loc.period) if b[p + 1] > b[p] else None
                            for p in range(b.size - 1)]

    def holders(self, coords: np.ndarray, support: float) -> tuple[np.ndarray, np.ndarray]:
        """``(rank, obs)``, each (n_pairs,) int64: every rank with a domain within the search reach of
        ``support`` of observation ``i`` at ``coords`` (n, n_dim), observations ascending within a rank."""
        ranks, idx = [], []
        for p, geo in enumerate(self._geometries):
            if geo is None or coords.shape[0] == 0:
                continue
            reach = geo.search_reach(support) * (1.0 + SLACK)
            near = np.flatnonzero(geo.nearest_distance(coords, reach) <= reach)
            ranks.append(np.full(near.size, p, np.int64))
            idx.append(near.astype(np.int64))
        if not ranks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ranks), np.concatenate(idx)
