"""Inflation: one parameter set, one pure function, called by every filter.

Conventions (factors multiply *anomalies*, i.e. standard deviations):

- ``prior`` lambda_f: prior anomalies are multiplied by lambda_f before the
  analysis. Inside square-root filters this is PDAF's forgetting factor
  rho = 1 / lambda_f**2 in ``A^{-1} = rho (N-1) I + Y'^T R^{-1} Y'``.
- ``posterior`` lambda_a: analysis anomalies are multiplied by lambda_a
  (DAPPER's ``infl``).
- ``rtpp`` alpha: relaxation to prior perturbations (Zhang et al. 2004),
  ``X'a <- (1 - alpha) X'a + alpha X'f``.
- ``rtps`` alpha: relaxation to prior spread (Whitaker & Hamill 2012),
  ``X'a <- X'a (1 + alpha (sigma_f - sigma_a) / sigma_a)`` row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class Inflation:
    prior: float = 1.0  # lambda_f, multiplies prior anomalies (>= 1 in practice, > 0 required)
    posterior: float = 1.0  # lambda_a, multiplies analysis anomalies
    rtpp: float = 0.0  # alpha in [0, 1]
    rtps: float = 0.0  # alpha in [0, 1]

    def __post_init__(self) -> None:
        for name in ("prior", "posterior"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise InputError(f"inflation.{name} must be a finite number > 0, got {v!r}", item=f"inflation.{name}")
        for name in ("rtpp", "rtps"):
            v = getattr(self, name)
            if not (np.isfinite(v) and 0.0 <= v <= 1.0):
                raise InputError(f"inflation.{name} must be in [0, 1], got {v!r}", item=f"inflation.{name}")

    @property
    def forgetting_factor(self) -> float:
        """PDAF's rho = 1 / prior**2."""
        return 1.0 / self.prior**2

    @property
    def acts_after(self) -> bool:
        """True when something is applied to the analysis anomalies."""
        return self.posterior != 1.0 or self.rtpp != 0.0 or self.rtps != 0.0


def inflate_posterior(Xa: np.ndarray, Xf: np.ndarray, infl: Inflation) -> None:
    """Apply RTPP, RTPS and posterior inflation to ``Xa`` in place.

    Parameters
    ----------
    Xa : (n_rows, N) analysis ensemble, updated in place.
    Xf : (n_rows, N) prior (forecast) ensemble, *before* prior inflation.
    """
    if not infl.acts_after:
        return
    ma = Xa.mean(axis=1, keepdims=True)
    Aa = Xa - ma
    if infl.rtpp or infl.rtps:
        Af = Xf - Xf.mean(axis=1, keepdims=True)
        if infl.rtpp:
            Aa *= 1.0 - infl.rtpp
            Aa += infl.rtpp * Af
        if infl.rtps:
            n = Xa.shape[1]
            sf = np.sqrt((Af * Af).sum(axis=1, keepdims=True) / (n - 1))
            sa = np.sqrt((Aa * Aa).sum(axis=1, keepdims=True) / (n - 1))
            # Rows the analysis left without spread keep it that way.
            with np.errstate(divide="ignore", invalid="ignore"):
                fac = np.where(sa > 0, 1.0 + infl.rtps * (sf - sa) / sa, 1.0)
            Aa *= fac
    if infl.posterior != 1.0:
        Aa *= infl.posterior
    np.add(ma, Aa, out=Xa)
