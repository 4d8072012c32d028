"""Linear observation operators applied rank-locally and summed across ranks.

H is a sparse (n_obs, n_state) matrix. Each rank multiplies the columns of H
that fall in its row block by its rows of X; the partial products are summed
across ranks (one Allreduce of n_obs x N numbers), so every rank ends with
the full H X whatever the decomposition. Alternatively H(x) may be given per
member by an external operator stage (:class:`GivenHX`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from enkflow.errors import InputError
from enkflow.parallel import Comm


@dataclass
class LinearObsOperator:
    """Sparse linear H, shape (n_obs, n_state)."""

    H: sp.csr_matrix
    _blocks: dict = field(default_factory=dict, repr=False)

    @property
    def n_obs(self) -> int:
        return int(self.H.shape[0])

    @property
    def n_state(self) -> int:
        return int(self.H.shape[1])

    @classmethod
    def selection(cls, state_index: np.ndarray, n_state: int) -> "LinearObsOperator":
        """H x = x[state_index]: observations located at state rows."""
        idx = np.asarray(state_index, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((idx < 0) | (idx >= n_state))
        if bad.size:
            raise InputError(
                f"observation {bad[0]} refers to state row {idx[bad[0]]}, outside the domain [0, {n_state})",
                item="obs.state_index", index=int(bad[0]),
            )
        n = idx.size
        H = sp.csr_matrix((np.ones(n), idx, np.arange(n + 1)), shape=(n, n_state))
        return cls(H)

    @classmethod
    def bilinear(
        cls,
        grid_lon: np.ndarray,
        grid_lat: np.ndarray,
        row_of_cell: np.ndarray,
        obs_lon: np.ndarray,
        obs_lat: np.ndarray,
        n_state: int,
    ) -> "LinearObsOperator":
        """Bilinear interpolation on a regular lon-lat grid (periodic in longitude).

        ``grid_lon`` (nx,) and ``grid_lat`` (ny,) ascending cell centres in
        degrees; ``row_of_cell`` (ny, nx) the state row of each cell or -1 where
        the cell is not in the state (e.g. ocean in a land state). Corners
        outside the state are dropped and the remaining weights renormalized;
        an observation with no corner in the state, or beyond the outermost
        latitudes, is outside the domain and raises.
        """
        lon = np.asarray(grid_lon, float)
        lat = np.asarray(grid_lat, float)
        olon = np.asarray(obs_lon, float)
        olat = np.asarray(obs_lat, float)
        nx, ny = lon.size, lat.size
        if row_of_cell.shape != (ny, nx):
            raise InputError(f"row_of_cell has shape {row_of_cell.shape}, expected (ny, nx) = ({ny}, {nx})", item="row_of_cell")
        out = np.flatnonzero((olat < lat[0]) | (olat > lat[-1]) | ~np.isfinite(olat) | ~np.isfinite(olon))
        if out.size:
            k = int(out[0])
            raise InputError(
                f"observation {k} at (lon, lat) = ({olon[k]}, {olat[k]}) is outside the grid's latitudes [{lat[0]}, {lat[-1]}]",
                item="obs.coords", index=k,
            )
        dlon = 360.0 / nx
        x = np.mod(olon - lon[0], 360.0) / dlon
        i0 = np.floor(x).astype(np.int64) % nx
        fx = x - np.floor(x)
        j0 = np.clip(np.searchsorted(lat, olat, side="right") - 1, 0, ny - 2)
        fy = (olat - lat[j0]) / (lat[j0 + 1] - lat[j0])
        i1 = (i0 + 1) % nx
        cols = np.stack([row_of_cell[j0, i0], row_of_cell[j0, i1], row_of_cell[j0 + 1, i0], row_of_cell[j0 + 1, i1]], axis=1)
        wts = np.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], axis=1)
        wts = np.where(cols >= 0, wts, 0.0)
        tot = wts.sum(axis=1)
        none = np.flatnonzero(tot <= 0)
        if none.size:
            k = int(none[0])
            raise InputError(
                f"observation {k} at (lon, lat) = ({olon[k]}, {olat[k]}) has no grid corner in the state (outside the domain)",
                item="obs.coords", index=k,
            )
        wts /= tot[:, None]
        rows = np.repeat(np.arange(olon.size), 4)
        H = sp.csr_matrix((wts.ravel(), (rows, np.where(cols >= 0, cols, 0).ravel())), shape=(olon.size, n_state))
        H.eliminate_zeros()
        return cls(H)

    @classmethod
    def rectilinear(
        cls,
        axes: list[np.ndarray],
        row_of_cell: np.ndarray,
        obs_coords: np.ndarray,
        n_state: int,
        periods: list[float | None] | None = None,
    ) -> "LinearObsOperator":
        """Linear (1 axis) or bilinear (2 axes) interpolation on a rectilinear grid.

        ``axes``: 1 or 2 ascending coordinate arrays (x first, e.g. longitude, then latitude);
        ``row_of_cell`` (len(axes[1]), len(axes[0])) or (len(axes[0]),): the state row of each
        grid point, -1 where the point is not in the state (masked); ``obs_coords`` (n_obs, len(axes));
        ``periods``: per axis, the period (360 for a global longitude) or None. Corners outside the
        state are dropped and the remaining weights renormalized. An observation beyond a
        non-periodic axis, or with no corner in the state, is outside the domain: InputError with
        its index. An observation on a grid point gets weight exactly 1 on it.
        """
        oc = np.asarray(obs_coords, dtype=np.float64)
        oc = oc[:, None] if oc.ndim == 1 else oc
        n_obs, nd = oc.shape
        if nd != len(axes) or nd not in (1, 2):
            raise InputError(f"interpolation takes 1 or 2 coordinates per observation, got {nd} for {len(axes)} axes",
                             item="obs.coords")
        periods = list(periods) if periods is not None else [None] * nd
        lo, hi, frac = [], [], []
        for k, (a, per) in enumerate(zip(axes, periods)):
            a = np.asarray(a, dtype=np.float64)
            x = oc[:, k]
            n = a.size
            if per is not None:
                t = np.mod(x - a[0], per)
                rel = a - a[0]
                i0 = np.clip(np.searchsorted(rel, t, side="right") - 1, 0, n - 1)
                wrap = i0 == n - 1
                i1 = np.where(wrap, 0, np.minimum(i0 + 1, n - 1))
                span = np.where(wrap, per - rel[-1], rel[np.minimum(i0 + 1, n - 1)] - rel[i0])
                f = np.where(span > 0, (t - rel[i0]) / np.where(span > 0, span, 1.0), 0.0)
            else:
                out = np.flatnonzero((x < a[0]) | (x > a[-1]) | ~np.isfinite(x))
                if out.size:
                    j = int(out[0])
                    raise InputError(f"observation {j} has coordinate {k} = {x[j]!r}, outside the grid's "
                                     f"[{a[0]:g}, {a[-1]:g}] (outside the domain)", item="obs.coords", index=j)
                if n == 1:
                    i0 = i1 = np.zeros(n_obs, np.int64)
                    f = np.zeros(n_obs)
                else:
                    i0 = np.clip(np.searchsorted(a, x, side="right") - 1, 0, n - 2)
                    i1 = i0 + 1
                    f = (x - a[i0]) / (a[i1] - a[i0])
            lo.append(i0)
            hi.append(i1)
            frac.append(f)
        if nd == 1:
            cols = np.stack([row_of_cell[lo[0]], row_of_cell[hi[0]]], axis=1)
            wts = np.stack([1 - frac[0], frac[0]], axis=1)
        else:
            (i0, j0), (i1, j1), (fx, fy) = lo, hi, frac
            cols = np.stack([row_of_cell[j0, i0], row_of_cell[j0, i1], row_of_cell[j1, i0], row_of_cell[j1, i1]], axis=1)
            wts = np.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], axis=1)
        wts = np.where(cols >= 0, wts, 0.0)
        tot = wts.sum(axis=1)
        none = np.flatnonzero(tot <= 0)
        if none.size:
            j = int(none[0])
            raise InputError(f"observation {j} at {tuple(float(v) for v in oc[j])} has no grid corner in the state "
                             "(outside the domain)", item="obs.coords", index=j)
        # Exact 1 on a grid point: no renormalization where the weights already sum to 1.
        wts = np.where(tot[:, None] == 1.0, wts, wts / tot[:, None])
        rows = np.repeat(np.arange(n_obs), cols.shape[1])
        H = sp.csr_matrix((wts.ravel(), (rows, np.where(cols >= 0, cols, 0).ravel())), shape=(n_obs, n_state))
        H.eliminate_zeros()
        return cls(H)

    def _block(self, start: int, stop: int) -> sp.csr_matrix:
        key = (start, stop)
        if key not in self._blocks:
            self._blocks[key] = self.H[:, start:stop].tocsr()
        return self._blocks[key]

    def apply_local(self, X_local: np.ndarray, start: int) -> np.ndarray:
        """Partial H X from rows ``start:start+len(X_local)`` of the state, shape (n_obs, N)."""
        stop = start + X_local.shape[0]
        if stop > self.n_state:
            raise InputError(f"rows [{start}, {stop}) exceed the state size {self.n_state}", item="X")
        Hb = self._block(start, stop)
        # Column by column: each member's rows are contiguous in an F-ordered X, so
        # no copy of the ensemble block is made (a sparse @ F-ordered matrix would).
        out = np.empty((self.n_obs, X_local.shape[1]))
        for k in range(X_local.shape[1]):
            out[:, k] = Hb @ X_local[:, k]
        return out

    def apply(self, X_local: np.ndarray, start: int, comm: Comm) -> np.ndarray:
        """Full H X (n_obs, N) on every rank: local products summed across ranks."""
        return comm.allreduce_sum(self.apply_local(X_local, start))


@dataclass(frozen=True)
class GivenHX:
    """H(x) computed per member by an external operator stage, shape (n_obs, N)."""

    HX: np.ndarray

    def apply(self, X_local: np.ndarray, start: int, comm: Comm) -> np.ndarray:
        return self.HX
