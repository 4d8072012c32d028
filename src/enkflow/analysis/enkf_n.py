"""The finite-size ensemble Kalman filter EnKF-N (Bocquet 2011), in its dual form.

The EnKF-N treats the prior covariance as unknown, with a Jeffreys hyperprior,
and so estimates in every cycle the factor ``l1`` that multiplies the prior
anomalies: no inflation needs tuning. It is a global filter: every rank finds
the same ``l1`` and the same transform from the full ``HX`` and applies them to
its own rows.

With ``S = R^{-1/2} Y'`` (p, N) the normalised observation anomalies, its thin
SVD ``S = U diag(s) V^T`` and ``du = U^T R^{-1/2} dy`` (k = min(p, N) entries),
``l1`` minimises the dual cost (Bocquet, Raanes & Hannart 2015, eq. 32, written
for the factor on the anomalies as DAPPER's ``EnKF_N`` writes it)::

    J(l1) = sum_i du_i^2 / (l1^2 s_i^2 + N - 1) + eN / l1^2 + cL ln(l1^2)

with the hyperprior's constants ``eN = (N + 1) / N`` and ``cL = (N + g) / (N - 1)``,
corrected towards a prior mode of 1 where the observations weigh little
(Bocquet et al. 2015, eq. 36: the factor ``mc`` of :func:`hyperprior_coefficients`)
and both multiplied by ``xN`` (Raanes, Bocquet & Carrassi 2019, sec. 2.1: a
hyperprior as certain as ``xN`` times N members). The analysis is then the ETKF
(symmetric square root, Hunt et al. 2007) of the prior anomalies multiplied by ``l1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

from enkflow.analysis.global_filters import Filter, apply_transform
from enkflow.analysis.inflation import inflate_posterior
from enkflow.analysis.obsset import ObsSet
from enkflow.analysis.transforms import estkf_projection, letkf_weights
from enkflow.errors import InputError


@dataclass(frozen=True, kw_only=True, slots=True)
class DualCost:
    """The dual cost J(l1) of one analysis (see the module docstring).

    ``s2`` (k,): squared singular values of R^{-1/2} Y'; ``du2`` (k,): squared innovation
    components along the left singular vectors; ``n1`` = N - 1; ``en``, ``cl``: the
    hyperprior's constants."""

    s2: np.ndarray
    du2: np.ndarray
    n1: float
    en: float
    cl: float

    def __call__(self, l1: float) -> float:
        return float(np.sum(self.du2 / (l1**2 * self.s2 + self.n1)) + self.en / l1**2 + self.cl * np.log(l1**2))

    def derivative(self, l1: float) -> float:
        """dJ/dl1: < 0 as l1 -> 0 (the eN term), > 0 as l1 -> infinity (the log term)."""
        fit = np.sum(self.s2 * self.du2 / (l1**2 * self.s2 + self.n1) ** 2)
        return float(-2.0 * l1 * fit - 2.0 * self.en / l1**3 + 2.0 * self.cl / l1)

    def minimiser(self) -> float:
        """The root of dJ/dl1 (Brent's method, to 1e-12) in a bracket grown by factors of 2 from 1."""
        lo = hi = 1.0
        while self.derivative(lo) >= 0.0:
            lo /= 2.0
        while self.derivative(hi) <= 0.0:
            hi *= 2.0
        from scipy.optimize import brentq  # lazy: 80 ms in every server and analysis task; only EnKF-N uses it

        return float(brentq(self.derivative, lo, hi, xtol=1e-12))


def hyperprior_coefficients(s2: np.ndarray, n: int, xn: float, g: int) -> tuple[float, float]:
    """``(eN, cL)`` of the dual cost for an ensemble of ``n`` members.

    ``s2`` (k,): squared singular values of R^{-1/2} Y'. The mode correction (Bocquet et al. 2015,
    eq. 36, as DAPPER's ``hyperprior_coeffs``) moves the prior mode eN/cL of l1 towards 1 by the
    power ``I_KH`` = (N - 1) mean_i 1/(s_i^2 + N - 1) over the N eigenvalues of Y'^T R^{-1} Y' + (N-1) I
    (the prior's weight in the analysis); then ``xn`` multiplies both."""
    n1 = n - 1
    en = (n + 1) / n
    cl = (n + g) / n1
    diagonal = np.full(n, float(n1))
    diagonal[: s2.size] += s2
    i_kh = float(np.mean(1.0 / diagonal)) * n1
    mc = np.sqrt((en / cl) ** i_kh)
    return xn * en / mc, xn * cl * mc


def mean_preserving_rotation(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal (n, n) matrix Q with Q 1 = 1: Haar-distributed on the subspace orthogonal to
    the ones vector (QR of a Gaussian matrix with the signs fixed, Mezzadri 2007), identity along it,
    as DAPPER's ``genOG_1`` (Sakov & Bocquet's iEnKS code)."""
    q, r = np.linalg.qr(rng.standard_normal((n - 1, n - 1)))
    q *= np.where(np.diag(r) < 0, -1.0, 1.0)
    t = estkf_projection(n)  # (n, n-1), orthonormal columns orthogonal to the ones vector
    return np.full((n, n), 1.0 / n) + t @ q @ t.T


@dataclass(frozen=True, kw_only=True)
class EnKFN(Filter):
    """Finite-size EnKF, dual form (Bocquet 2011; Bocquet, Raanes & Hannart 2015; DAPPER's ``EnKF_N``).

    ``xn`` > 0 scales the hyperprior's certainty (DAPPER's ``xN``); ``g`` >= 0 is the nullity
    correction of the log term (DAPPER's ``g``); ``rotate``: the analysis anomalies are turned by a
    random mean-preserving rotation drawn from (``seed``, cycle) (DAPPER's ``rot=True``).
    Inflation: a prior factor multiplies the anomalies before the EnKF-N estimates its own;
    posterior, RTPP and RTPS act on the (rotated) analysis, as DAPPER's ``infl`` does."""

    xn: float = 1.0
    g: int = 0
    rotate: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.xn) and self.xn > 0):
            raise InputError(f"enkf_n.xn must be a finite number > 0, got {self.xn!r}", item="enkf_n.xn")
        if self.g < 0:
            raise InputError(f"enkf_n.g must be an integer >= 0, got {self.g!r}", item="enkf_n.g")

    def dual_cost(self, Yp: np.ndarray, dy: np.ndarray, error_var: np.ndarray) -> DualCost:
        """The dual cost of observation anomalies ``Yp`` (p, N), innovation ``dy`` (p,) and
        error variances ``error_var`` (p,)."""
        n = Yp.shape[1]
        sd = np.sqrt(error_var)
        u, s, _ = sla.svd(Yp / sd[:, None], full_matrices=False, check_finite=False)
        du = u.T @ (dy / sd)
        en, cl = hyperprior_coefficients(s**2, n, self.xn, self.g)
        return DualCost(s2=s**2, du2=du**2, n1=float(n - 1), en=en, cl=cl)

    def analyze(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet, *, cycle: int = 0) -> np.ndarray:
        """``Xa`` (n_rows, N) from ``X`` (n_rows, N) and ``HX`` (n_obs, N)."""
        self._check(X, HX, obs)
        n = X.shape[1]
        Yp = self.inflation.prior * (HX - HX.mean(axis=1, keepdims=True))
        dy = obs.values - HX.mean(axis=1)
        l1 = self.dual_cost(Yp, dy, obs.error_var).minimiser()
        w, W = letkf_weights(dy, Yp, 1.0 / obs.error_var, 1.0 / l1**2)
        if self.rotate:
            W = W @ mean_preserving_rotation(n, np.random.default_rng([self.seed, cycle])).T
        Xa = apply_transform(X, self.inflation.prior * w, self.inflation.prior * W)
        inflate_posterior(Xa, X, self.inflation)
        return Xa
