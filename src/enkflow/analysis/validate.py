"""Input checks shared by every filter: typed errors that name the item at fault."""

from __future__ import annotations

import numpy as np

from enkflow.errors import InputError
from enkflow.analysis.obsset import ObsSet


def first_bad(a: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN/Inf in ``a`` or None. The common case reads ``a`` once: the sum of its squares
    is finite unless an element is not, or the squares overflow (elements beyond 1e154 in float64); only then
    is every element looked at."""
    flat = a.ravel(order="K")  # a view of any contiguous array, in memory order
    with np.errstate(all="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return None
    bad = np.argwhere(~np.isfinite(a))
    return tuple(int(i) for i in bad[0]) if bad.size else None


def check_ensemble(X: np.ndarray, name: str = "ensemble") -> None:
    """``X`` (n_rows, N): 2-D, N >= 2, finite."""
    if not isinstance(X, np.ndarray) or X.ndim != 2:
        raise InputError(f"{name} must be a 2-D array (n_rows, n_members), got {getattr(X, 'shape', type(X))}", item=name)
    if X.shape[1] < 2:
        raise InputError(f"{name} has {X.shape[1]} member(s); an ensemble filter needs at least 2", item=name)
    bad = first_bad(X)
    if bad is not None:
        raise InputError(f"{name} holds NaN or Inf at (row, member) = {bad}", item=name, index=bad)


def check_obs_ensemble(HX: np.ndarray, obs: ObsSet, n_members: int) -> None:
    """``HX`` (n_obs, N) must match the observation set and the ensemble."""
    if HX.ndim != 2 or HX.shape != (obs.n_obs, n_members):
        raise InputError(
            f"HX has shape {HX.shape}, expected (n_obs, n_members) = ({obs.n_obs}, {n_members})", item="HX"
        )
    bad = first_bad(HX)
    if bad is not None:
        raise InputError(f"HX (the ensemble in observation space) holds NaN or Inf at (obs, member) = {bad}", item="HX", index=bad)
