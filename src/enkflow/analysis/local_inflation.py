"""Adaptive inflation in the local filters: each domain's factor from its local observations.

For a chunk of domains (:class:`~enkflow.analysis.local_filters.LocalFilter` analyses them
together), :func:`update_domains` takes the mean of the field (n_rows, 2) over each domain's
rows as the domain's prior value, updates it with the scheme (:class:`AdaptiveScheme`) from the
domain's local observations and their taper weights, and writes the posterior to the domain's
rows. DART's schemes weight each observation by gamma = taper weight x |correlation| (DART's
``final_factor * abs(correl)``): here the mean over the domain's rows of |the correlation of the
row's prior ensemble and the observation's|. A posterior factor (``adaptive_target = "posterior"``)
multiplies the analysis anomalies of the domain's rows by its square root (:func:`inflate_rows`).
"""

from __future__ import annotations

import numpy as np

from enkflow.analysis.adaptive_inflation import AdaptiveScheme, domain_values
from enkflow.analysis.domains import LocalDomains

_BLOCK = 65536  # (domain, observation) pairs per block of the correlations: bounds their memory


def update_domains(scheme: AdaptiveScheme, field: np.ndarray, sub: LocalDomains, offsets: np.ndarray,
                   idx: np.ndarray, weight: np.ndarray, rinv: np.ndarray, dy: np.ndarray, yvar: np.ndarray,
                   X: np.ndarray, Yp: np.ndarray) -> np.ndarray:
    """The posterior factors (n_dom,) of the domains ``sub``, their rows of ``field`` (n_rows, 2)
    replaced by the posterior (factor, deviation). ``offsets``, ``idx``, ``weight``: each domain's
    local observations and taper weights; ``rinv``, ``dy``, ``yvar`` (n_obs,) as
    :meth:`AdaptiveScheme.update` takes them; ``X`` (n_rows, N) the prior rows, ``Yp`` (n_obs, N)
    the observations' prior anomalies (for the correlations)."""
    if scheme.correlation_weighted:
        weight = weight * domain_correlations(X, sub, offsets, idx, Yp)
    post = scheme.update(domain_values(field, sub.offsets, sub.rows), offsets, idx, weight, rinv, dy, yvar,
                         members=X.shape[1])
    field[sub.rows] = np.repeat(post, np.diff(sub.offsets), axis=0)
    return post[:, 0]


def domain_correlations(X: np.ndarray, sub: LocalDomains, offsets: np.ndarray, idx: np.ndarray,
                        Yp: np.ndarray) -> np.ndarray:
    """For every (domain, observation) pair of ``offsets``/``idx``: the mean over the domain's rows
    of |corr(X[row], Yp[obs])| (0 for a row or an observation without spread): (n_pairs,) float64."""
    rows = sub.rows
    A = X[rows] - X[rows].mean(axis=1, keepdims=True)
    A = _unit_rows(A)
    B = _unit_rows(Yp)
    dom = np.repeat(np.arange(sub.n_domains), np.diff(offsets))
    n_rows = np.diff(sub.offsets)[dom]
    first = sub.offsets[dom]
    out = np.zeros(idx.size)
    for j in range(int(n_rows.max(initial=0))):
        for p0 in range(0, idx.size, _BLOCK):
            p = np.arange(p0, min(p0 + _BLOCK, idx.size))
            p = p[n_rows[p] > j]
            out[p] += np.abs(np.einsum("ij,ij->i", A[first[p] + j], B[idx[p]]))
    return np.divide(out, n_rows, out=np.zeros_like(out), where=n_rows > 0)


def _unit_rows(A: np.ndarray) -> np.ndarray:
    """``A`` (n, N) anomalies with each row scaled to unit norm (rows of zero norm stay 0)."""
    norm = np.sqrt(np.einsum("ij,ij->i", A, A))[:, None]
    return np.divide(A, norm, out=np.zeros_like(A), where=norm > 0)


def inflate_rows(out: np.ndarray, sub: LocalDomains, factor: np.ndarray) -> None:
    """Multiply the anomalies of each domain's rows of ``out`` (n_rows, N) by sqrt(``factor``) (n_dom,), in place."""
    rows = sub.rows
    f = np.sqrt(np.repeat(factor, np.diff(sub.offsets)))[:, None]
    Xr = out[rows]
    mean = Xr.mean(axis=1, keepdims=True)
    out[rows] = mean + f * (Xr - mean)
