"""Local nonlinear ensemble transform filter, LNETF (Toedter & Ahrens 2015), as DAPPER's ``LNETF``.

A second-order exact particle-filter update per local domain: the members get importance
weights from the local observations, the analysis mean and covariance are the weighted ones,
and a deterministic square root makes the analysis ensemble. For domain k with local
observations j (taper weight rho_j, error variance R_j), prior anomalies X' (n_rows, N) and
observation anomalies Y' (n_obs, N), innovation of the mean dy = y - mean(HX) (Toedter & Ahrens
2015, sec. 2; DAPPER 1.7.1 ``dapper.da_methods.other.LNETF``):

- weights: w_i = exp(-1/2 sum_j rho_j (dy_j - Y'_ji)^2 / (Rs^2 R_j)), normalised to sum 1
  (``Rs`` >= 1 flattens them: Toedter & Ahrens's remedy for the weights' collapse);
- mean:       xa = xf + X' w;
- anomalies:  X'a = X' W,  W = sqrt(N) [diag(w) - w w^T]^{1/2} Q^T, the symmetric square root
  (eigendecomposition, negative round-off eigenvalues set to 0), Q a random orthogonal N x N
  matrix with Q 1 = 1 (the mean kept) or the identity;

so Xa = xf 1^T + X' (w 1^T + W). The weighted covariance X' [diag(w) - w w^T] X'^T is matched
exactly (the "second-order exact" of the paper's title, with N in place of N - 1).

``rotate``: DAPPER applies one rotation to the whole analysis ensemble after the local analyses
(``post_process``); a member must stay one spatially coherent state, so the rotation is the same
in every domain: drawn from (``seed``, cycle) alone, it is the same on every rank, and the
result does not depend on the rank count or the balance.

Inflation: ``prior`` (and an adaptive scheme's per-domain prior factor) multiplies X' and Y'
before the weights (the prior ensemble inflated); ``posterior`` (DAPPER's ``infl``), RTPP and RTPS
act on the analysis anomalies as for every filter (:func:`~enkflow.analysis.inflation.inflate_posterior`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis.adaptive_inflation import segment_sums
from enkflow.analysis.domains import LocalDomains
from enkflow.analysis.inflation import inflate_posterior
from enkflow.analysis.local_filters import LocalFilter
from enkflow.errors import InputError


def mean_preserving_rotation(seed: int, cycle: int, n: int) -> np.ndarray:
    """A random orthogonal (n, n) matrix Q with Q 1 = 1, Haar-distributed on the orthogonal
    complement of 1 (Q = V diag(1, O) V^T, V orthonormal with first column 1/sqrt(n), O from the
    QR decomposition of a Gaussian matrix with R's diagonal made positive; Mezzadri 2007).
    Drawn from ``numpy.random.default_rng([seed, cycle])``."""
    rng = np.random.default_rng([seed, cycle])
    O, R = np.linalg.qr(rng.standard_normal((n - 1, n - 1)))
    O *= np.where(np.diag(R) < 0, -1.0, 1.0)
    basis = np.eye(n)
    basis[:, 0] = 1.0
    V = np.linalg.qr(basis)[0]
    inner = np.eye(n)
    inner[1:, 1:] = O
    return V @ inner @ V.T


def particle_weights(log_lik: np.ndarray) -> np.ndarray:
    """Normalised importance weights (n_dom, N) from the log-likelihoods ``log_lik`` (n_dom, N),
    shifted by each domain's maximum first so that exp does not underflow for all members."""
    w = np.exp(log_lik - log_lik.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return w


def transforms(w: np.ndarray, rotation: np.ndarray | None) -> np.ndarray:
    """The LNETF transforms (n_dom, N, N), w 1^T + sqrt(N) [diag(w) - w w^T]^{1/2} Q^T, of the
    weights ``w`` (n_dom, N); ``rotation`` Q (N, N) or None (the identity)."""
    N = w.shape[1]
    M = -w[:, :, None] * w[:, None, :]
    M[:, np.arange(N), np.arange(N)] += w
    vals, vecs = np.linalg.eigh(M)
    S = (vecs * np.sqrt(np.maximum(vals, 0.0))[:, None, :]) @ vecs.transpose(0, 2, 1)
    W = np.sqrt(N) * S
    if rotation is not None:
        W = W @ rotation.T
    return W + w[:, :, None]


@dataclass(frozen=True, kw_only=True)
class LNETF(LocalFilter):
    """Local nonlinear ensemble transform filter (module docstring). ``rs``: DAPPER's ``Rs``;
    ``rotate``: the random mean-preserving rotation, drawn from (``seed``, cycle)."""

    rs: float = 1.0
    rotate: bool = False
    seed: int = 0
    work_elements: int = 1 << 22  # float64 elements of one slice's work arrays, about (bounds memory)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.rs) and self.rs > 0):
            raise InputError(f"lnetf.rs must be a finite number > 0, got {self.rs!r}", item="lnetf.rs")

    def _analyse_chunk(self, out: np.ndarray, sub: LocalDomains, offsets: np.ndarray, idx: np.ndarray,
                       rinv_w: np.ndarray, Yp: np.ndarray, dy: np.ndarray, rho_k: float | np.ndarray,
                       gamma_dom: np.ndarray | None, cycle: int) -> None:
        """The LNETF analyses of the domains ``sub`` (see :meth:`LocalFilter._analyse_chunk`), in
        slices of domains whose work arrays hold about ``work_elements`` numbers."""
        N = out.shape[1]
        prior = 1.0 / np.sqrt(np.broadcast_to(rho_k, (sub.n_domains,)))  # anomaly factor per domain
        rotation = mean_preserving_rotation(self.seed, cycle, N) if self.rotate else None
        n_rows = np.diff(sub.offsets)
        cost = np.cumsum((np.diff(offsets) + N * (n_rows + 1)) * N)
        a = 0
        while a < sub.n_domains:
            b = max(int(np.searchsorted(cost, (cost[a - 1] if a else 0) + self.work_elements, "right")), a + 1)
            o0, o1 = offsets[a], offsets[b]
            lam = np.repeat(prior[a:b], np.diff(offsets[a : b + 1]))
            innov = dy[idx[o0:o1], None] - lam[:, None] * Yp[idx[o0:o1]]
            sq = (rinv_w[o0:o1, None] / self.rs**2) * innov**2
            w = particle_weights(-0.5 * segment_sums(sq, offsets[a : b + 1] - o0))
            T = transforms(w, rotation) * prior[a:b, None, None]
            rows = sub.rows[sub.offsets[a] : sub.offsets[b]]
            Xf = out[rows]
            xbar = Xf.mean(axis=1, keepdims=True)
            T_rows = np.repeat(T, n_rows[a:b], axis=0)
            Xa = xbar + np.matmul((Xf - xbar)[:, None, :], T_rows)[:, 0, :]
            inflate_posterior(Xa, Xf, self.inflation)
            out[rows] = Xa
            a = b

