"""Adaptive multiplicative prior inflation estimated from innovation statistics (Miyoshi 2011).

Miyoshi, T. (2011): The Gaussian approach to adaptive covariance inflation and its
implementation with the local ensemble transform Kalman filter. Mon. Wea. Rev. 139, 1519-1535.

Each local domain carries a covariance inflation factor rho (the prior covariance is
rho P^f; its anomalies are multiplied by sqrt(rho)) and the standard deviation s of that
estimate. Every cycle, before the domain's analysis, the factor is updated from the domain's
own observations, localized as the analysis localizes them (R^{-1} times the taper weight w_i),
as in Miyoshi's LETKF code (``letkf_core``):

- observation estimate ``rho_o = (d^T R~^{-1} d - p) / tr(H P^f H^T R~^{-1})``,
  with d = y - H x^f, R~^{-1} = diag(w_i / r_i), p = sum_i w_i and P^f the
  *uninflated* sample covariance (Li et al. 2009, eq. for the innovation statistic
  d^T R~^{-1} d = rho tr(H P^f H^T R~^{-1}) + p);
- its error variance ``v_o = (2 / p) ((rho_b tr + p) / tr)^2``;
- Gaussian update of the prior estimate rho_b of variance v_b:
  ``rho_a = rho_b + v_b / (v_b + v_o) (rho_o - rho_b)``, ``v_a = v_b v_o / (v_b + v_o)``.

Miyoshi fixes v_b = sigma_b^2 (0.04^2) every cycle, so that the estimate keeps adapting. Where
the innovations carry little signal per cycle (tr / p small: dense, accurate-enough observations
every few model steps, as in Lorenz-96 with R = I) v_o is of order 100 and the gain
sigma_b^2 / v_o of order 1e-5: from a first guess of 1 the estimate needs tens of thousands of
cycles to reach its equilibrium. Here the variance is carried from cycle to cycle as in a
Kalman filter for rho, from ``sd_initial`` (DART's ``inf_sd_initial``, 0.6 recommended
there) at the first cycle, and bounded below by sigma_b (``sd``; DART's ``inf_sd_lower_bound``):
``v_b(t+1) = max(v_a(t), sigma_b^2)``. While v_b is large the estimate is the information-weighted
mean of the observation estimates so far; once v_b reaches sigma_b^2 it is Miyoshi's scheme
exactly. ``sd_initial <= sd`` gives Miyoshi's fixed variance from the first cycle.

rho_a inflates this cycle's analysis (DART and Miyoshi's code inflate with the carried estimate and update
it for the next cycle). The next cycle's prior
estimate is rho_a (persistence, the paper's choice), or with ``relax`` > 0 relaxed towards
``initial`` by that fraction. Domains without observations (p = 0) keep their prior estimate.
rho is clipped to ``[minimum, maximum]``.

The state is kept per state row (the rows of a domain share one value), so that it can be
carried from cycle to cycle whatever the domains or the ranks' row blocks: a *field* of shape
(n_rows, 2), column 0 the factor rho, column 1 the standard deviation s of the estimate. The
field's files are :mod:`enkflow.io.inflation_field`'s; :class:`enkflow.experiment.inflation.InflationCarrier`
carries it from cycle to cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from enkflow.analysis.inflation_anderson import Anderson2009
from enkflow.analysis.inflation_gharamti import Gharamti2018
from enkflow.config import AdaptiveInflation, AdaptiveTarget, InflationConfig
from enkflow.errors import InputError


class AdaptiveScheme(Protocol):
    """An adaptive inflation scheme, as the local filters, the serial filter,
    :class:`~enkflow.experiment.inflation.InflationCarrier` and :func:`from_config` use it.

    Its state is a field (n_rows, 2) float64: column 0 the covariance inflation factor of every
    state row, column 1 the standard deviation of its estimate. ``target``: the covariance the
    factor multiplies (prior: before the analysis; posterior: the analysis anomalies times its
    square root). ``sd``: the lower bound of the deviation (also the deviation of a field file
    without one). ``correlation_weighted``: the local filters multiply each observation's taper
    weight by |the correlation of the domain's rows and the observation's prior ensemble| (DART's
    gamma) before :meth:`update`."""

    @property
    def sd(self) -> float: ...
    @property
    def target(self) -> AdaptiveTarget: ...
    @property
    def correlation_weighted(self) -> bool: ...

    def initial_field(self, n_rows: int) -> np.ndarray:
        """The field (n_rows, 2) of the first cycle."""
        ...

    def forecast(self, field: np.ndarray) -> np.ndarray:
        """The next cycle's prior field (n_rows, 2) from this cycle's posterior one (a new array)."""
        ...

    def update(self, prior: np.ndarray, offsets: np.ndarray, idx: np.ndarray, weight: np.ndarray, rinv: np.ndarray,
               dy: np.ndarray, yvar: np.ndarray, *, members: int) -> np.ndarray:
        """Posterior (n_dom, 2) of the local domains from their prior values ``prior`` (n_dom, 2):
        domain k's observations ``idx[offsets[k]:offsets[k+1]]`` with ``weight`` (same length);
        ``rinv``, ``dy``, ``yvar`` (n_obs,): 1 / error variance, innovation y - mean(H x), prior
        variance of H(x) (ddof = 1) before the adaptive factor; ``members`` the ensemble size."""
        ...

    def update_serial(self, prior: np.ndarray, weight: np.ndarray, y_prior_var: float, obs_var: float,
                      innovation: float, *, members: int | None = None) -> np.ndarray:
        """One observation's update of the rows within its support: ``prior`` (n, 2), ``weight`` (n,)
        localization x |correlation of the row and the observation| (the correlation only where
        ``correlation_weighted``), ``y_prior_var`` its prior variance before the adaptive factor
        (ddof = 1), ``obs_var`` its error variance, ``innovation`` y - mean(H x); ``members`` the
        ensemble size. Returns the posterior (n, 2), a new array."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Miyoshi2011:
    """Parameters of the estimate; ``sd`` is the paper's sigma_b (0.04 there), the lower bound of
    the estimate's standard deviation, ``sd_initial`` that deviation at the first cycle."""

    initial: float = 1.0  # covariance factor at the first cycle
    sd: float = 0.04  # lower bound of the standard deviation of the prior estimate (sigma_b)
    sd_initial: float = 0.6  # standard deviation of the estimate at the first cycle (DART's inf_sd_initial)
    minimum: float = 1.0
    maximum: float = 10.0
    relax: float = 0.0  # 0: persistence; r: rho_b(t+1) = rho_a(t) + r (initial - rho_a(t))
    target = AdaptiveTarget.PRIOR
    correlation_weighted = False

    def __post_init__(self) -> None:
        for name in ("initial", "sd", "sd_initial", "minimum", "maximum"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise InputError(f"inflation.adaptive_{name} must be a finite number > 0, got {v!r}",
                                 item=f"inflation.adaptive_{name}")
        if not self.minimum <= self.initial <= self.maximum:
            raise InputError(f"inflation.adaptive_initial ({self.initial}) must lie in [adaptive_minimum, adaptive_maximum]"
                             f" = [{self.minimum}, {self.maximum}]", item="inflation.adaptive_initial")
        if not (0.0 <= self.relax <= 1.0):
            raise InputError(f"inflation.adaptive_relax must be in [0, 1], got {self.relax!r}", item="inflation.adaptive_relax")

    def initial_field(self, n_rows: int) -> np.ndarray:
        """The field of the first cycle: (n_rows, 2) float64, ``initial`` and ``sd_initial`` everywhere."""
        out = np.empty((n_rows, 2))
        out[:, 0], out[:, 1] = self.initial, self.sd_initial
        return out

    def forecast(self, field: np.ndarray) -> np.ndarray:
        """The prior field of the next cycle from this cycle's posterior ``field`` (n_rows, 2), a new
        array: the factor persists (or relaxes towards ``initial``), its deviation is at least ``sd``."""
        out = np.array(field, dtype=np.float64, copy=True)
        if self.relax != 0.0:
            out[:, 0] += self.relax * (self.initial - out[:, 0])
        np.maximum(out[:, 1], self.sd, out=out[:, 1])
        return out

    def update(self, prior: np.ndarray, offsets: np.ndarray, idx: np.ndarray, weight: np.ndarray,
               rinv: np.ndarray, dy: np.ndarray, yvar: np.ndarray, *, members: int = 0) -> np.ndarray:
        """Posterior (factor, deviation) (n_dom, 2) from the prior ones ``prior`` (n_dom, 2).

        Domain k uses observations ``idx[offsets[k]:offsets[k+1]]`` with taper weights
        ``weight`` (same length as ``idx``); ``rinv`` (n_obs,) 1 / error variance, ``dy``
        (n_obs,) innovations y - mean(HX), ``yvar`` (n_obs,) the uninflated ensemble
        variance of H(x) (ddof = 1). The estimate does not depend on ``members`` (the protocol's).
        """
        wr = weight * rinv[idx]
        drd = segment_sums(wr * dy[idx] ** 2, offsets)
        tr = segment_sums(wr * yvar[idx], offsets)
        p = segment_sums(weight, offsets)
        out = np.array(prior, dtype=np.float64, copy=True)
        ok = (p > 0) & (tr > 0)
        if ok.any():
            rb, t, pk = out[ok, 0], tr[ok], p[ok]
            vb = np.maximum(out[ok, 1], self.sd) ** 2
            rho_o = (drd[ok] - pk) / t
            var_o = 2.0 / pk * ((rb * t + pk) / t) ** 2
            gain = vb / (vb + var_o)
            out[ok, 0] = rb + gain * (rho_o - rb)
            out[ok, 1] = np.sqrt(gain * var_o)  # v_a = v_b v_o / (v_b + v_o)
        np.clip(out[:, 0], self.minimum, self.maximum, out=out[:, 0])
        return out


    def update_serial(self, prior: np.ndarray, weight: np.ndarray, y_prior_var: float, obs_var: float,
                      innovation: float, *, members: int | None = None) -> np.ndarray:
        """One observation's update of each of the rows ``prior`` (n, 2) with taper ``weight`` (n,):
        :meth:`update` with that one observation per row (the estimate from p = w)."""
        n = prior.shape[0]
        if np.shape(weight) != (n,):
            raise InputError(f"update_serial: weight has shape {np.shape(weight)}, the rows {n}", item="weight")
        one = np.ones(1)
        return self.update(prior, np.arange(n + 1), np.zeros(n, np.int64), np.asarray(weight, np.float64),
                           one / obs_var, one * innovation, one * y_prior_var)


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sums of ``values[offsets[k]:offsets[k+1]]`` (along axis 0) for every k: (len(offsets) - 1,
    *values.shape[1:]) float64 (0 if empty)."""
    n = offsets.size - 1
    out = np.zeros((max(n, 0),) + values.shape[1:])
    starts = offsets[:-1]
    full = offsets[1:] > starts
    if full.any():  # a segment of reduceat runs to the next index: the empty ones between add nothing
        out[full] = np.add.reduceat(values[: offsets[-1]], starts[full], axis=0)
    return out


def domain_values(field: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The mean of ``field`` (n_rows, ...) over each domain's rows (CSR ``offsets``, ``rows``):
    (n_dom, ...); 1 for a domain without rows."""
    counts = np.diff(offsets).reshape((-1,) + (1,) * (field.ndim - 1))
    sums = segment_sums(field[rows], offsets)
    return np.divide(sums, counts, out=np.ones_like(sums), where=counts > 0)


def from_config(cfg: InflationConfig) -> AdaptiveScheme | None:
    """The scheme an ``[analysis.inflation]`` table names (its unset keys at the scheme's defaults), or None."""
    if cfg.adaptive is AdaptiveInflation.NONE:
        return None
    cls = {AdaptiveInflation.MIYOSHI2011: Miyoshi2011, AdaptiveInflation.GHARAMTI2018: Gharamti2018,
           AdaptiveInflation.ANDERSON2009: Anderson2009}[cfg.adaptive]
    return cls(**cfg.adaptive_parameters())
