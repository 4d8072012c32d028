"""Global ensemble filters: one analysis for the whole state.

Each filter is a frozen, keyword-only dataclass of its parameters with one
method ``analyze(X, HX, obs, *, cycle=0) -> Xa``:

- ``X``  (n_rows, N): prior ensemble rows held by this rank (Fortran order preferred)
- ``HX`` (n_obs, N): the full ensemble in observation space (same on every rank)
- ``obs``: the :class:`~enkflow.obs.ObsSet`
- ``cycle``: the assimilation cycle; it selects a stochastic filter's random
  draws (so a rerun cycle draws the same) and is ignored by deterministic ones

Every rank computes the same small transform from ``HX`` and applies it to its
own rows, so the result does not depend on the rank count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from enkflow.analysis.inflation import Inflation, inflate_posterior
from enkflow.analysis.transforms import estkf_weights, kalman_gain_ens, letkf_weights
from enkflow.analysis.validate import check_ensemble, check_obs_ensemble
from enkflow.analysis.obsset import ObsSet

if TYPE_CHECKING:  # the local and serial filters derive from Filter
    from enkflow.analysis.local_filters import LocalFilter
    from enkflow.analysis.serial_filter import EnSRF


@dataclass(frozen=True, kw_only=True)
class Filter:
    """Base class: a subclass must define ``analyze``.

    A filter says itself how its analysis divides: :meth:`as_local` is None for a global filter (one
    transform from the full ``HX``, the same on every rank, applied to each rank's rows), the filter
    itself for a local one (one analysis per domain of rows, so the rows may be split over the ranks
    in any way: :class:`~enkflow.analysis.local_filters.LocalFilter`). :meth:`as_serial` is the filter
    itself for the serial one (observations one at a time, each rank's rows updated with their
    coordinates: :class:`~enkflow.analysis.serial_filter.EnSRF`), None otherwise."""

    inflation: Inflation = field(default_factory=Inflation)

    def __init_subclass__(cls, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if not callable(getattr(cls, "analyze", None)):
            raise TypeError(f"{cls.__name__} must define analyze(X, HX, obs)")

    def as_local(self) -> LocalFilter | None:
        """This filter as a local filter (domains, localization, statistics), or None: a global filter."""
        return None

    def as_serial(self) -> EnSRF | None:
        """This filter as the serial filter (it needs its rows' coordinates), or None."""
        return None

    def _check(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet) -> None:
        check_ensemble(X)
        check_obs_ensemble(HX, obs, X.shape[1])


def apply_transform(X: np.ndarray, w: np.ndarray, W: np.ndarray) -> np.ndarray:
    """The ensemble ``X`` (n_rows, N) transformed by the mean weights ``w`` (N,) and the anomaly transform
    ``W`` (N, N): ``mean(X) + X' (w 1^T + W)``, F order (the square-root filters' last step)."""
    xbar = X.mean(axis=1, keepdims=True)
    Xp = X - xbar
    return np.asfortranarray(xbar + Xp @ (w[:, None] + W))


@dataclass(frozen=True, kw_only=True)
class _TransformFilter(Filter):
    """A square-root filter given by its weights function ``(dy, Yp, rinv, rho) -> (w, W)``."""

    _weights = staticmethod(letkf_weights)

    def analyze(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet, *, cycle: int = 0) -> np.ndarray:
        self._check(X, HX, obs)
        Yp = HX - HX.mean(axis=1, keepdims=True)
        dy = obs.values - HX.mean(axis=1)
        w, W = self._weights(dy, Yp, 1.0 / obs.error_var, self.inflation.forgetting_factor)
        Xa = apply_transform(X, w, W)
        inflate_posterior(Xa, X, self.inflation)
        return Xa


@dataclass(frozen=True, kw_only=True)
class ETKF(_TransformFilter):
    """Ensemble transform Kalman filter, symmetric square root (Hunt et al. 2007)."""

    _weights = staticmethod(letkf_weights)


@dataclass(frozen=True, kw_only=True)
class ESTKF(_TransformFilter):
    """Error-subspace transform Kalman filter (Nerger et al. 2012), symmetric square root."""

    _weights = staticmethod(estkf_weights)


def _prior_anomalies(X: np.ndarray, HX: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xbar = X.mean(axis=1, keepdims=True)
    hbar = HX.mean(axis=1, keepdims=True)
    return xbar, lam * (X - xbar), hbar, lam * (HX - hbar)


@dataclass(frozen=True, kw_only=True)
class DEnKF(Filter):
    """Deterministic EnKF (Sakov & Oke 2008): mean with the full gain, anomalies with half of it."""

    def analyze(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet, *, cycle: int = 0) -> np.ndarray:
        self._check(X, HX, obs)
        xbar, Xp, hbar, Yp = _prior_anomalies(X, HX, self.inflation.prior)
        K = kalman_gain_ens(Xp, Yp, obs.error_var)
        xa = xbar[:, 0] + K @ (obs.values - hbar[:, 0])
        Xa = np.asfortranarray(xa[:, None] + Xp - 0.5 * (K @ Yp))
        inflate_posterior(Xa, X, self.inflation)
        return Xa


@dataclass(frozen=True, kw_only=True)
class EnKF(Filter):
    """Stochastic EnKF with perturbed observations (Burgers et al. 1998).

    ``seed`` fixes the perturbations; ``centred`` removes their ensemble mean so
    that the analysis mean equals the Kalman update of the prior mean.
    Every rank draws the same perturbations (same seed, same n_obs).
    """

    seed: int = 0
    centred: bool = False

    def analyze(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet, *, cycle: int = 0) -> np.ndarray:
        self._check(X, HX, obs)
        N = X.shape[1]
        xbar, Xp, hbar, Yp = _prior_anomalies(X, HX, self.inflation.prior)
        rng = np.random.default_rng([self.seed, cycle])
        D = rng.standard_normal((obs.n_obs, N)) * np.sqrt(obs.error_var)[:, None]
        if self.centred:
            D -= D.mean(axis=1, keepdims=True)
        K = kalman_gain_ens(Xp, Yp, obs.error_var)
        innov = obs.values[:, None] + D - (hbar + Yp)  # (p, N)
        Xa = np.asfortranarray(xbar + Xp + K @ innov)
        inflate_posterior(Xa, X, self.inflation)
        return Xa
