"""What DART's two Bayesian adaptive inflation schemes share: one observation at a time.

Anderson (2009) (:mod:`enkflow.analysis.inflation_anderson`) and El Gharamti (2018)
(:mod:`enkflow.analysis.inflation_gharamti`) treat the covariance inflation factor lambda of a
state row as a random variable with a mode ``lambda_b`` and a standard deviation ``sigma_b``,
and update both from each observation in turn (DART's ``adaptive_inflate_mod``, flavours 2 and 5)
with the likelihood of the observation's innovation d = y - mean(H x) (Anderson 2009, eq. 4):

    p(d | lambda) = N(d; 0, theta^2),  theta^2 = (1 + gamma (sqrt(lambda) - 1))^2 sigma_p^2 + sigma_o^2,

sigma_p^2 the observation's prior ensemble variance before the adaptive factor, sigma_o^2 its error
variance and gamma in [0, 1] how much of the row's inflation reaches the observation: DART's
localization weight times |correlation of the row and the observation's prior ensemble| (a
gamma of 0 changes nothing). Both linearise the likelihood about lambda_b, l(lambda) ~ l(lambda_b)
(1 + s (lambda - lambda_b)) with the slope ``s = l'/l`` at lambda_b, take the mode of prior x that
line as the new lambda (the root of a quadratic, :func:`mode_root`), and fit the new deviation to
the exact posterior density one old deviation above the new mode.

Around each observation's update, as DART's ``update_inflation``: lambda is clipped to
[``minimum``, ``maximum``] and sigma bounded below by ``sd`` (``inf_sd_lower_bound``); a deviation
at that bound stays there (with ``sd_initial == sd``, DART's recommended 0.6 for both, sigma is
fixed). Before each cycle the carried factor is damped towards 1 (``inf_damping``, DART's filter):
lambda <- 1 + damping (lambda - 1).

``target``: :attr:`AdaptiveTarget.PRIOR` inflates the prior covariance (the analysis of this cycle
with the updated factor, as for Miyoshi 2011 in :mod:`enkflow.analysis.adaptive_inflation`);
:attr:`AdaptiveTarget.POSTERIOR` multiplies the analysis covariance (El Gharamti et al. 2019's
posterior inflation). The local filters have no posterior observation ensemble, so the posterior
factor is estimated from the prior innovations: the forecast is taken to carry the previous
analysis' factor (no model error, linear growth), so sigma_p^2 is deflated by the carried factor
first, as DART deflates its inflated observation priors: sigma_p^2 / (1 + gamma (sqrt(lambda_b) - 1))^2.

Everything is vectorised over rows or domains: arrays of one shape, float64.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from enkflow.config import AdaptiveTarget
from enkflow.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class DartInflation(ABC):
    """The parameters DART's schemes share (DART's ``filter_nml`` names in the comments); a subclass
    gives the one-observation update :meth:`_one`."""

    initial: float = 1.0  # inf_initial
    sd: float = 0.6  # inf_sd_lower_bound
    sd_initial: float = 0.6  # inf_sd_initial
    minimum: float = 1.0  # inf_lower_bound
    maximum: float = 50.0  # inf_upper_bound (DART's guide recommends 50)
    damping: float = 0.9  # inf_damping
    target: AdaptiveTarget = AdaptiveTarget.PRIOR
    correlation_weighted = True  # the filter multiplies the localization weight by |correlation|

    def __post_init__(self) -> None:
        for name in ("initial", "sd", "sd_initial", "maximum"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise InputError(f"inflation.adaptive_{name} must be a finite number > 0, got {v!r}",
                                 item=f"inflation.adaptive_{name}")
        if not (np.isfinite(self.minimum) and self.minimum >= 0):
            raise InputError(f"inflation.adaptive_minimum must be a finite number >= 0, got {self.minimum!r}",
                             item="inflation.adaptive_minimum")
        if self.minimum > self.maximum:
            raise InputError(f"inflation.adaptive_minimum ({self.minimum}) is above adaptive_maximum ({self.maximum})",
                             item="inflation.adaptive_minimum")
        if not self.minimum <= self.initial <= self.maximum:
            raise InputError(f"inflation.adaptive_initial ({self.initial}) must lie in [adaptive_minimum, "
                             f"adaptive_maximum] = [{self.minimum}, {self.maximum}]", item="inflation.adaptive_initial")
        if not (0.0 <= self.damping <= 1.0):
            raise InputError(f"inflation.adaptive_damping must be in [0, 1], got {self.damping!r}",
                             item="inflation.adaptive_damping")

    def initial_field(self, n_rows: int) -> np.ndarray:
        """The field of the first cycle: (n_rows, 2) float64, ``initial`` and ``sd_initial`` everywhere."""
        out = np.empty((n_rows, 2))
        out[:, 0], out[:, 1] = self.initial, self.sd_initial
        return out

    def forecast(self, field: np.ndarray) -> np.ndarray:
        """The prior field (n_rows, 2) of the next cycle from this cycle's posterior ``field``, a new
        array: the factor damped towards 1, its deviation at least ``sd``."""
        out = np.array(field, dtype=np.float64, copy=True)
        if self.damping != 1.0:
            out[:, 0] = 1.0 + self.damping * (out[:, 0] - 1.0)
        np.maximum(out[:, 1], self.sd, out=out[:, 1])
        return out

    def update(self, prior: np.ndarray, offsets: np.ndarray, idx: np.ndarray, weight: np.ndarray,
               rinv: np.ndarray, dy: np.ndarray, yvar: np.ndarray, *, members: int) -> np.ndarray:
        """Posterior (factor, deviation) (n_dom, 2) of every domain from ``prior`` (n_dom, 2): domain k
        assimilates its observations ``idx[offsets[k]:offsets[k+1]]`` one after the other, in that
        order, each with gamma ``weight`` (same length as ``idx``; localization x |correlation|);
        ``rinv`` (n_obs,) 1 / error variance, ``dy`` (n_obs,) innovations, ``yvar`` (n_obs,) the
        prior variance of H(x) (ddof = 1) before the adaptive factor; ``members`` the ensemble size."""
        out = np.array(prior, dtype=np.float64, copy=True)
        counts = np.diff(offsets)
        for j in range(int(counts.max(initial=0))):
            k = np.nonzero(counts > j)[0]
            p = offsets[k] + j
            o = idx[p]
            out[k] = self._step(out[k], weight[p], yvar[o], 1.0 / rinv[o], dy[o] ** 2, members)
        return out

    def update_serial(self, prior: np.ndarray, weight: np.ndarray, y_prior_var: float, obs_var: float,
                      innovation: float, *, members: int | None = None) -> np.ndarray:
        """The update of the rows within one observation's support (DART's per-observation update):
        ``prior`` (n, 2) their factors and deviations, ``weight`` (n,) gamma of each row (localization
        x |correlation of the row and the observation's prior ensemble|), ``y_prior_var`` the
        observation's prior ensemble variance before the adaptive factor (ddof = 1), ``obs_var`` its
        error variance, ``innovation`` y - mean(H x). ``members``: the ensemble size, for El
        Gharamti's finite-ensemble term (None: left out). Returns the posterior (n, 2), a new array."""
        w = np.asarray(weight, dtype=np.float64)
        if w.shape != (prior.shape[0],):
            raise InputError(f"update_serial: weight has shape {w.shape}, the rows {prior.shape[0]}", item="weight")
        full = np.full(w.shape, 1.0)
        return self._step(np.array(prior, dtype=np.float64), w, full * y_prior_var, full * obs_var,
                          full * innovation**2, members)

    def _step(self, prior: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray, d2: np.ndarray,
              members: int | None) -> np.ndarray:
        """One observation's update of ``prior`` (n, 2) with its gamma, sigma_p^2, sigma_o^2 and d^2
        (each (n,)), then the bounds. Rows with gamma <= 0 keep their values."""
        out = prior.copy()
        ok = gamma > 0
        if not ok.any():
            return out
        lam, sd, g = prior[ok, 0], prior[ok, 1], gamma[ok]
        s = sp2[ok]
        if self.target is AdaptiveTarget.POSTERIOR:
            s = s / (1.0 + g * (np.sqrt(lam) - 1.0)) ** 2  # the carried factor taken out of the forecast
        lam_new, sd_new = self._one(lam, sd, g, s, so2[ok], d2[ok], members)
        out[ok, 0] = np.clip(lam_new, self.minimum, self.maximum)
        out[ok, 1] = np.where(sd <= self.sd, sd, np.maximum(sd_new, self.sd))
        return out

    @abstractmethod
    def _one(self, lam: np.ndarray, sd: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray,
             d2: np.ndarray, members: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The scheme's new (mode, deviation) from the prior ones after one observation (arrays (n,), gamma > 0)."""


def theta2(lam: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray, inv_n: float = 0.0) -> np.ndarray:
    """The innovation variance theta^2 for the factor ``lam`` (Anderson 2009, eq. 4); ``inv_n`` 1/N:
    El Gharamti's finite-ensemble term, -sigma_p^2 / N where (1 + gamma (sqrt(lam) - 1))^2 >= 1/N (DART)."""
    f = (1.0 + gamma * (np.sqrt(lam) - 1.0)) ** 2
    return np.where(f >= inv_n, f - inv_n, f) * sp2 + so2


def likelihood_slope(lam: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray, d2: np.ndarray,
                     inv_n: float = 0.0) -> np.ndarray:
    """``s = l'(lam) / l(lam)`` of the likelihood N(d; 0, theta^2(lam)): (dtheta/dlam / theta)(d^2/theta^2 - 1),
    dtheta/dlam = gamma sigma_p^2 (1 - gamma + gamma sqrt(lam)) / (2 theta sqrt(lam)) (Anderson 2009, eq. A3)."""
    t2 = theta2(lam, gamma, sp2, so2, inv_n)
    dtheta_over_theta = 0.5 * sp2 * gamma * (1.0 - gamma + gamma * np.sqrt(lam)) / (t2 * np.sqrt(lam))
    return dtheta_over_theta * (d2 / t2 - 1.0)


def log_likelihood(lam: np.ndarray, gamma: np.ndarray, sp2: np.ndarray, so2: np.ndarray, d2: np.ndarray,
                   inv_n: float = 0.0) -> np.ndarray:
    """log N(d; 0, theta^2(lam)) without its constant -log(2 pi)/2."""
    t2 = theta2(lam, gamma, sp2, so2, inv_n)
    return -0.5 * np.log(t2) - 0.5 * d2 / t2


def mode_root(a: np.ndarray | float, b: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The root x of a x^2 + b x + c = 0 (roots of opposite signs, c / a < 0) with the sign of the
    likelihood's slope ``s``: the mode of prior x linearised likelihood moves towards the likelihood.
    DART takes the root nearest 0; that is the same root unless the line is steep, where the nearest
    one lies where 1 + s x < 0 (a minimum of the product). Computed without cancellation
    (q = -(b + sign(b) sqrt(b^2 - 4ac)) / 2, roots q/a and c/q); 0 where s = 0."""
    q = -0.5 * (b + np.where(b >= 0, 1.0, -1.0) * np.sqrt(b * b - 4.0 * a * c))
    with np.errstate(divide="ignore", invalid="ignore"):
        r1, r2 = q / a, c / q
    return np.where(s == 0, 0.0, np.where(np.sign(r2) == np.sign(s), r2, r1))
