"""Quality control of the observations of one analysis, from the full H X.

Two checks, decided before the assimilation from values every MPI rank holds whole
(``y`` and ``HX``, (n_obs, N), the same on every rank), so every rank rejects the same
observations:

* gross error: reject observation i where ``|y_i - mean(HX_i)| > k_i sqrt(sigma_o,i^2 + sigma_b,i^2)``,
  ``sigma_b,i^2`` the ensemble variance of ``HX_i`` (ddof = 1), ``k_i`` the observation's threshold
  (per kind; ``inf``: not checked);
* background-departure buddy check (optional): among the observations the gross check kept,
  the normalized departure ``z_i = (y_i - mean HX_i) / sqrt(sigma_o^2 + sigma_b^2)`` is compared
  with the median of its buddies' (same kind, closer than ``buddy_radius``, at least two);
  observation i is rejected where they differ by more than ``buddy_sigma``. The median keeps
  one bad observation from condemning its good neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis.geometry import Geometry
from enkflow.analysis.obsset import ObsSet
from enkflow.config import Metric
from enkflow.errors import InputError

ACCEPTED, GROSS, BUDDY = 0, 1, 2
MIN_BUDDIES = 2


@dataclass(frozen=True)
class QCResult:
    """``flags`` (n_obs,) int8: 0 accepted, 1 rejected by the gross-error check, 2 by the buddy check."""

    flags: np.ndarray

    @property
    def keep(self) -> np.ndarray:
        return self.flags == ACCEPTED

    def counts(self, kinds: np.ndarray, names: dict[int, str] | None = None) -> dict[str, float]:
        """Diagnostics: ``qc_rejected``, ``qc_gross``, ``qc_buddy`` and ``qc_rejected:KIND`` per kind
        present (the kind's name, or its code)."""
        names = names or {}
        out = {"qc_rejected": float(np.count_nonzero(self.flags)), "qc_gross": float(np.count_nonzero(self.flags == GROSS)),
               "qc_buddy": float(np.count_nonzero(self.flags == BUDDY))}
        for c in np.unique(kinds).tolist():
            out[f"qc_rejected:{names.get(c, str(c))}"] = float(np.count_nonzero(self.flags[kinds == c]))
        return out


@dataclass(frozen=True)
class QualityControl:
    """The checks of one cycle's observations.

    ``gross_sigma`` (n_obs,) thresholds k (inf: none) or None (no gross-error check);
    ``buddy_radius`` (km on the sphere, the state coordinates' units otherwise) or None (no buddy check),
    with ``metric`` and ``period`` measuring the distances between observations."""

    gross_sigma: np.ndarray | None = None
    buddy_radius: float | None = None
    buddy_sigma: float = 3.0
    metric: Metric = Metric.CARTESIAN
    period: float | None = None

    @property
    def active(self) -> bool:
        return self.gross_sigma is not None or self.buddy_radius is not None

    def check(self, obs: ObsSet, HX: np.ndarray) -> QCResult:
        """Flags of ``obs`` given the ensemble in observation space ``HX`` (n_obs, N)."""
        z, flags = self.gross(obs, HX)
        if self.buddy_radius is not None:
            kept = np.flatnonzero(flags == ACCEPTED)
            pool = BuddyPool(obs.coords[kept], obs.kinds[kept], z[kept])
            flags[kept[self.buddy_rejects(pool, kept.size)]] = BUDDY
        return QCResult(flags)

    def gross(self, obs: ObsSet, HX: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(z, flags)``: the normalized departures (n_obs,) of ``obs`` from the ensemble ``HX``
        (n_obs, N) and the flags of the gross-error check alone (int8, GROSS or ACCEPTED)."""
        n = obs.n_obs
        if HX.shape[0] != n:
            raise InputError(f"HX has {HX.shape[0]} rows, the observations {n}", item="HX")
        flags = np.zeros(n, np.int8)
        if n == 0:
            return np.zeros(0), flags
        dep = obs.values - HX.mean(axis=1)
        scale = np.sqrt(obs.error_var + HX.var(axis=1, ddof=1))
        z = dep / scale
        if self.gross_sigma is not None:
            k = np.asarray(self.gross_sigma, dtype=np.float64).reshape(-1)
            if k.shape != (n,):
                raise InputError(f"gross_sigma has {k.size} values, the observations {n}", item="qc.gross_sigma")
            flags[np.abs(z) > k] = GROSS
        return z, flags

    def buddy_rejects(self, pool: "BuddyPool", n_checked: int) -> np.ndarray:
        """(n_checked,) bool: the buddy check's verdict on the first ``n_checked`` observations of
        ``pool`` (observations the gross check kept), their buddies sought among the whole pool."""
        if n_checked == 0 or self.buddy_radius is None:
            return np.zeros(n_checked, bool)
        geo = Geometry(self.metric, pool.coords, self.period)
        nb = geo.neighbours(pool.coords[:n_checked], self.buddy_radius)
        dom = np.repeat(np.arange(n_checked), nb.counts)
        pair = (nb.idx != dom) & (pool.kinds[nb.idx] == pool.kinds[dom])
        dom, buddy = dom[pair], nb.idx[pair]
        # The median of each observation's buddies, all at once: sort by (observation, buddy's z).
        vals = pool.z[buddy]
        order = np.lexsort((vals, dom))
        vals = vals[order]
        count = np.bincount(dom, minlength=n_checked)
        start = np.concatenate([[0], np.cumsum(count)[:-1]])
        enough = count >= MIN_BUDDIES
        lo = np.where(enough, start + (count - 1) // 2, 0)
        hi = np.where(enough, start + count // 2, 0)
        med = 0.5 * (vals[lo] + vals[hi]) if vals.size else np.zeros(n_checked)
        return enough & (np.abs(pool.z[:n_checked] - med) > self.buddy_sigma)


@dataclass(frozen=True)
class BuddyPool:
    """Observations the gross check kept, as the buddy check sees them: ``coords`` (n, n_dim) in the
    check's metric, ``kinds`` (n,) int32 and normalized departures ``z`` (n,) float64."""

    coords: np.ndarray
    kinds: np.ndarray
    z: np.ndarray
