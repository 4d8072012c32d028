"""Enhanced adaptive inflation with an inverse-gamma prior (El Gharamti 2018).

El Gharamti, M. (2018): Enhanced adaptive inflation algorithm for ensemble filters. Mon. Wea.
Rev. 146, 623-640. DART's ``inf_flavor = 5``, the scheme DART recommends.

The factor lambda of each state row is inverse-gamma, IG(alpha, beta) with density
beta^alpha / Gamma(alpha) lambda^(-alpha-1) exp(-beta / lambda), mode beta / (alpha + 1) and
variance beta^2 / ((alpha - 1)^2 (alpha - 2)). The carried (mode, deviation) = (lambda_b, sigma_b)
give (alpha, beta): with x = beta / lambda_b = alpha + 1 the variance condition is the cubic
``(x - 2)^2 (x - 3) = (lambda_b / sigma_b)^2 x^2`` (El Gharamti 2018, section 3a), of which exactly
one root has alpha > 2 (the left side over x^2 increases for x > 3); solved in closed form
(Cardano, or the trigonometric form where the cubic has three real roots), then two Newton steps.

After an observation with the likelihood of :mod:`enkflow.analysis.inflation_dart` (with El
Gharamti's finite-ensemble term: theta^2 = ((1 + gamma (sqrt(lambda) - 1))^2 - 1/N) sigma_p^2 + sigma_o^2,
as DART's ``enh_linear_bayes``; slope s = l'/l at lambda_b):

- mode: the maximum of IG(lambda; alpha, beta) (1 + s (lambda - lambda_b)), the root on the side
  of s (DART takes the one nearest lambda_b, which for a steep likelihood is a minimum) of
  ``(1 - lambda_b / beta) lambda^2 + (1/s - 2 lambda_b) lambda + lambda_b^2 - lambda_b / s = 0``;
  with x = lambda - lambda_b and u = lambda_b / beta: ``(1 - u) s x^2 + (1 - 2 u lambda_b s) x - u lambda_b^2 s = 0``;
  a mode <= 0 keeps lambda_b;
- deviation: the inverse gamma of mode lambda_u through the exact posterior density p at lambda_u and
  lambda_u + sigma_b: ln(p(lambda_u + sigma_b) / p(lambda_u)) = beta_u omega with
  ``omega = (ln lambda_u - ln(lambda_u + sigma_b)) / lambda_u + 1 / lambda_u - 1 / (lambda_u + sigma_b)``,
  alpha_u = beta_u / lambda_u - 1, sigma_u = beta_u / ((alpha_u - 1) sqrt(alpha_u - 2)). Unlike the
  Gaussian scheme the deviation may grow, by at most ``sd_max_change`` per observation (DART's
  ``inf_sd_max_change``); sigma_b is kept where alpha_u <= 2 or the ratio is not finite.

DART's defaults, its guide's recommendation for flavour 5: initial 1, sd_initial = sd = 0.6 (a
deviation at its lower bound stays there, so these fix it), maximum 50, damping 0.9, sd_max_change
1.05; minimum 1 (``filter_nml``'s default: the guide's 0, deflation allowed, lets single domains
deflate and under-inflates Lorenz-96, docs/analysis.md; the inverse gamma keeps lambda > 0 with 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis.inflation_dart import DartInflation, likelihood_slope, log_likelihood, mode_root
from enkflow.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class Gharamti2018(DartInflation):
    """El Gharamti (2018) with DART's defaults (see :class:`~enkflow.analysis.inflation_dart.DartInflation`)."""

    sd_max_change: float = 1.05  # inf_sd_max_change: the deviation grows by at most this factor per observation

    def __post_init__(self) -> None:
        DartInflation.__post_init__(self)
        if not (1.0 <= self.sd_max_change <= 2.0):
            raise InputError(f"inflation.adaptive_sd_max_change must be in [1, 2], got {self.sd_max_change!r}",
                             item="inflation.adaptive_sd_max_change")

    def _one(self, lam: np.ndarray, sd: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray,
             d2: np.ndarray, members: int | None) -> tuple[np.ndarray, np.ndarray]:
        inv_n = 0.0 if members is None else 1.0 / members
        alpha, beta = inverse_gamma(lam, sd)
        u = lam / beta
        s = likelihood_slope(lam, gamma, sp2, so2, d2, inv_n)
        with np.errstate(invalid="ignore"):
            lam_u = lam + mode_root((1.0 - u) * s, 1.0 - 2.0 * u * lam * s, -u * lam * lam * s, s)
        lam_u = np.where(lam_u > 0, lam_u, lam)  # NaN compares False: kept as well
        if (sd <= self.sd).all():  # deviations at their bound stay there (DART's defaults): no density to fit
            return lam_u, sd

        def log_post(x: np.ndarray) -> np.ndarray:
            return -(alpha + 1.0) * np.log(x) - beta / x + log_likelihood(x, gamma, sp2, so2, d2, inv_n)

        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_r = log_post(lam_u + sd) - log_post(lam_u)
            omega = (np.log(lam_u) - np.log(lam_u + sd)) / lam_u + 1.0 / lam_u - 1.0 / (lam_u + sd)
            beta_u = log_r / omega
            alpha_u = beta_u / lam_u - 1.0
            sd_u = beta_u / ((alpha_u - 1.0) * np.sqrt(alpha_u - 2.0))
        keep = ~(alpha_u > 2.0) | ~np.isfinite(sd_u) | (sd_u > self.sd_max_change * sd)
        return lam_u, np.where(keep, sd, sd_u)


def inverse_gamma(mode: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shape alpha (> 2) and rate beta of the inverse gamma with ``mode`` and standard deviation ``sd``
    (arrays (n,), > 0): x = beta / mode the root > 3 of x^3 - (7 + r) x^2 + 16 x - 12 = 0, r = (mode / sd)^2."""
    r = (mode / sd) ** 2
    a2 = -(7.0 + r)
    p = 16.0 - a2 * a2 / 3.0
    q = 2.0 * a2**3 / 27.0 - 16.0 * a2 / 3.0 - 12.0
    disc = 0.25 * q * q + p**3 / 27.0
    with np.errstate(invalid="ignore"):
        root = np.sqrt(np.maximum(disc, 0.0))
        one = np.cbrt(-0.5 * q + root) + np.cbrt(-0.5 * q - root)
        pm = np.minimum(p, -1e-300)  # three real roots need p < 0
        three = 2.0 * np.sqrt(-pm / 3.0) * np.cos(np.arccos(np.clip(1.5 * q / pm * np.sqrt(-3.0 / pm), -1, 1)) / 3.0)
    x = np.where(disc >= 0, one, three) - a2 / 3.0
    for _ in range(2):  # Newton on f(x) = (x - 2)^2 (x - 3) - r x^2: the last bits
        f = (x - 2.0) ** 2 * (x - 3.0) - r * x * x
        df = 2.0 * (x - 2.0) * (x - 3.0) + (x - 2.0) ** 2 - 2.0 * r * x
        x = x - f / df
    return x - 1.0, x * mode
