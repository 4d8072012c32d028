"""The NumPy/SciPy baseline of `enkflow bench analysis`: the local LETKF as a user
would write it without enkflow's compiled kernel, and the exact reference the
kernel's results are checked against.

* Local search: one batched SciPy KD-tree query for all the baseline's points
  (``cKDTree.sparse_distance_matrix`` between the points' and the observations'
  trees, then a sort into CSR: the search enkflow itself ran before its blocked
  search, :mod:`enkflow.analysis.search`). A KD-tree query per point costs about
  0.1 ms of call overhead, more than the rest of the analysis' search, and would
  flatter the compiled kernel.
* Transform: per point, form the N x N matrix A^-1, LAPACK ``dsyevd``
  (eigenvalues and eigenvectors, ``numpy.linalg.eigh``), and apply the
  symmetric-square-root LETKF (Hunt et al. 2007; the formulation of
  :mod:`enkflow.analysis.transforms`) to the point's row. For N ~ 40 ``dsyevd``
  dominates and the Python loop around it costs little (a stacked
  ``numpy.linalg.eigh`` over the same matrices measured no faster).
"""

from __future__ import annotations

import time

import numpy as np

from scipy.spatial import cKDTree

from enkflow.analysis import Localization, ObsSet
from enkflow.analysis import taper as _taper

STAGES = ("search", "build", "eigen", "transform")
"""The baseline's timed stages; all but ``search`` make up its transform (kernel) time."""


def scipy_local_obs(loc: Localization, obs_coords: np.ndarray, dom_coords: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, idx, weight)`` CSR of the observations with non-zero taper weight around each
    Cartesian domain centre ``dom_coords`` (n_dom, n_dim), observations ``obs_coords`` (n_obs, n_dim)."""
    n_dom, n_obs = dom_coords.shape[0], obs_coords.shape[0]
    pairs = cKDTree(dom_coords).sparse_distance_matrix(cKDTree(obs_coords), loc.support, output_type="ndarray")
    order = np.argsort(pairs["i"].astype(np.int64) * n_obs + pairs["j"])
    dom, idx, dist = pairs["i"][order], pairs["j"][order].astype(np.int64), pairs["v"][order]
    wt = _taper.weights(loc.taper, dist, loc.half_width)
    keep = wt > 0.0
    offsets = np.zeros(n_dom + 1, np.int64)
    np.cumsum(np.bincount(dom[keep], minlength=n_dom), out=offsets[1:])
    return offsets, idx[keep], wt[keep]


def baseline_letkf(
    X: np.ndarray,
    HX: np.ndarray,
    obs: ObsSet,
    loc: Localization,
    coords: np.ndarray,
    points: np.ndarray,
    rho: float,
) -> tuple[np.ndarray, dict[str, float]]:
    """LETKF analysis of the rows ``points`` with one domain per row, timed by stage.

    ``X`` (n_rows, N) prior rows; ``HX`` (n_obs, N) the observation-space
    ensemble; ``coords`` (n_rows, n_dim) the rows' domain centres (grid units);
    ``points`` (n_points,) int row indices; ``rho`` the forgetting factor.
    Returns the analysis rows (n_points, N) and the seconds spent in each of
    :data:`STAGES` over all points (totals, not per point).
    """
    t = dict.fromkeys(STAGES, 0.0)
    N = X.shape[1]
    gamma = rho * (N - 1)
    sqrt_n1 = np.sqrt(N - 1.0)
    Yp = HX - HX.mean(axis=1, keepdims=True)
    dy = obs.values - HX.mean(axis=1)
    rinv = 1.0 / obs.error_var
    out = np.empty((points.size, N))
    t0 = time.perf_counter()
    offsets, idx_all, wt_all = scipy_local_obs(loc, obs.coords, coords[points])
    t["search"] = time.perf_counter() - t0
    for k, i in enumerate(points):
        t1 = time.perf_counter()
        sl = slice(offsets[k], offsets[k + 1])
        idx = idx_all[sl]
        Yl = Yp[idx]  # (p, N)
        C = Yl.T * (rinv[idx] * wt_all[sl])  # Y'^T R^-1, tapered (N, p)
        Ainv = C @ Yl
        Ainv.flat[:: N + 1] += gamma  # A^-1 = rho (N-1) I + Y'^T R^-1 Y'
        t2 = time.perf_counter()
        # numpy's eigh is LAPACK dsyevd with the least call overhead (SciPy's eigh
        # adds about 10 us per call); it reads one triangle, so no symmetrization.
        lam, V = np.linalg.eigh(Ainv)
        t3 = time.perf_counter()
        # One state row per domain: apply A's functions to that row's anomalies
        # (vectors) rather than forming the N x N transform W.
        x = X[i]
        xbar = x.mean()
        u = (x - xbar) @ V
        g = V.T @ (C @ dy[idx])
        out[k] = xbar + u @ (g / lam) + sqrt_n1 * ((u / np.sqrt(lam)) @ V.T)
        t4 = time.perf_counter()
        t["build"] += t2 - t1
        t["eigen"] += t3 - t2
        t["transform"] += t4 - t3
    return out, t
