"""Spatially and temporally varying adaptive inflation with a Gaussian prior (Anderson 2009).

Anderson, J. L. (2009): Spatially and temporally varying adaptive covariance inflation for
ensemble filters. Tellus 61A, 72-83. DART's ``inf_flavor = 2``.

The factor lambda of each state row is Gaussian, N(lambda_b, sigma_b^2). After an observation with
the likelihood of :mod:`enkflow.analysis.inflation_dart` (slope s = l'/l at lambda_b):

- mode: the maximum of N(lambda; lambda_b, sigma_b^2) (1 + s (lambda - lambda_b)) (Anderson 2009,
  eqs. A4-A6: the likelihood's Taylor expansion), i.e. the root nearest lambda_b (on the side of s) of
  ``lambda^2 + (1/s - 2 lambda_b) lambda + lambda_b^2 - sigma_b^2 - lambda_b / s = 0``; with
  x = lambda - lambda_b, ``s x^2 + x - sigma_b^2 s = 0``, x = 2 sigma_b^2 s / (1 + sqrt(1 + 4 sigma_b^2 s^2))
  (no division by s: an innovation that fits theta^2 exactly leaves lambda_b);
- deviation: the Gaussian through the exact posterior density p at the new mode lambda_u and at
  lambda_u + sigma_b: r = p(lambda_u + sigma_b) / p(lambda_u), ``sigma_u = sqrt(-sigma_b^2 / (2 ln r))``
  (Anderson 2009, section 3c); sigma_b is kept where r > 0.99 (numerically flat) or sigma_u > sigma_b.

A mode <= 0 keeps lambda_b (it cannot inflate). DART's defaults, its guide's recommendations
for flavour 2: initial 1, sd_initial = sd = 0.6 (the deviation then stays 0.6), minimum 1,
maximum 50, damping 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis.inflation_dart import DartInflation, likelihood_slope, log_likelihood, mode_root


@dataclass(frozen=True, kw_only=True, slots=True)
class Anderson2009(DartInflation):
    """Anderson (2009) with DART's defaults (see :class:`~enkflow.analysis.inflation_dart.DartInflation`)."""

    def _one(self, lam: np.ndarray, sd: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray,
             d2: np.ndarray, members: int | None) -> tuple[np.ndarray, np.ndarray]:
        v = sd * sd
        s = likelihood_slope(lam, gamma, sp2, so2, d2)
        lam_u = lam + mode_root(s, np.ones_like(s), -v * s, s)
        lam_u = np.where(lam_u > 0, lam_u, lam)
        if (sd <= self.sd).all():  # deviations at their bound stay there (DART's defaults): no density to fit
            return lam_u, sd

        def log_post(x: np.ndarray) -> np.ndarray:
            return -0.5 * (x - lam) ** 2 / v + log_likelihood(x, gamma, sp2, so2, d2)

        with np.errstate(divide="ignore", invalid="ignore"):
            log_r = log_post(lam_u + sd) - log_post(lam_u)
            sd_u = np.sqrt(-v / (2.0 * log_r))
        keep = ~(log_r < np.log(0.99)) | ~np.isfinite(sd_u) | (sd_u > sd)
        return lam_u, np.where(keep, sd, sd_u)
