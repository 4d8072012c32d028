"""Small random problems shared by the analysis tests."""

from __future__ import annotations

import numpy as np
from enkflow.analysis import ObsSet


def grid_problem(nx=24, ny=20, N=12, frac=0.15, std=0.5, seed=3):
    """Ensemble (n, N) F-order on an nx x ny grid, obs at a random fraction of points."""
    rng = np.random.default_rng(seed)
    xx, yy = np.meshgrid(np.arange(nx), np.arange(ny), indexing="ij")
    coords = np.column_stack((xx.ravel(), yy.ravel())).astype(float)
    n = coords.shape[0]
    base = np.sin(coords[:, 0] / 4.0) + np.cos(coords[:, 1] / 3.0)
    X = np.asfortranarray(base[:, None] + rng.standard_normal((n, N)))
    where = np.sort(rng.choice(n, max(2, int(frac * n)), replace=False))
    obs = ObsSet(base[where] + std * rng.standard_normal(where.size), np.full(where.size, std**2), coords[where])
    return X, X[where].copy(), obs, coords, where


