"""Ensemble transforms: pure functions on small arrays (one analysis domain).

Notation follows Hunt et al. (2007) and Nerger et al. (2012):

- ``Yp``  (p, N): observation-space anomalies Y' = H(X) - mean, local obs only
- ``dy``  (p,):   innovation y - mean(H(X))
- ``rinv`` (p,):  diagonal of R^{-1}, already multiplied by taper weights
- ``rho``:        forgetting factor (prior inflation 1/rho of the covariance)

Nothing here mutates its arguments.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla


def sym_eig(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK dsyevd on the symmetrized ``M``: eigenvalues ascending, eigenvectors in columns."""
    M = 0.5 * (M + M.T)
    return sla.eigh(M, driver="evd", check_finite=False)


def letkf_matrix(Yp: np.ndarray, rinv: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``(A^{-1}, C)``: A^{-1} = rho (N-1) I + Y'^T R^{-1} Y' (N, N) and C = Y'^T R^{-1} (N, p)."""
    N = Yp.shape[1]
    C = Yp.T * rinv
    Ainv = C @ Yp
    Ainv[np.diag_indices(N)] += rho * (N - 1)
    return Ainv, C


def letkf_from_eig(lam: np.ndarray, V: np.ndarray, C: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(w, W)`` from the eigendecomposition A^{-1} = V diag(lam) V^T."""
    N = V.shape[0]
    w = V @ ((V.T @ (C @ dy)) / lam)
    W = np.sqrt(N - 1) * (V / np.sqrt(lam)) @ V.T
    return w, W


def letkf_weights(dy: np.ndarray, Yp: np.ndarray, rinv: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """ETKF/LETKF weights (Hunt et al. 2007, eqs. 21-24).

    Returns ``w`` (N,) for the mean and ``W`` (N, N) = sqrt(N-1) A^{1/2}
    (symmetric square root) for the anomalies, so that
    ``Xa = xbar + X' w + X' W`` column-wise.
    """
    Ainv, C = letkf_matrix(Yp, rinv, rho)
    lam, V = sym_eig(Ainv)
    return letkf_from_eig(lam, V, C, dy)


def estkf_projection(N: int) -> np.ndarray:
    """Nerger et al. (2012) eq. 13: T (N, N-1) with T^T T = I and T^T 1 = 0."""
    a = 1.0 / (np.sqrt(N) + N)  # = 1/N * 1/(1/sqrt(N) + 1)
    T = np.full((N, N - 1), -a)
    T[np.arange(N - 1), np.arange(N - 1)] += 1.0
    T[N - 1, :] = -1.0 / np.sqrt(N)
    return T


def estkf_weights(dy: np.ndarray, Yp: np.ndarray, rinv: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """ESTKF/LESTKF weights in the error subspace (Nerger et al. 2012, eqs. 14-20).

    Works with L = X T (N-1 columns). Returned in ensemble form like
    :func:`letkf_weights`: ``w`` (N,) = T w~ and ``W`` (N, N) =
    sqrt(N-1) T A~^{1/2} T^T (symmetric square root, Omega = T), so that
    ``Xa = xbar + X' w + X' W``. With the symmetric square root the analysis
    ensemble equals the ETKF's.
    """
    N = Yp.shape[1]
    T = estkf_projection(N)
    HL = Yp @ T  # (p, N-1)
    C = HL.T * rinv
    Ainv = rho * (N - 1) * np.eye(N - 1) + C @ HL
    lam, V = sym_eig(Ainv)
    wt = V @ ((V.T @ (C @ dy)) / lam)
    Asqrt = (V / np.sqrt(lam)) @ V.T
    return T @ wt, np.sqrt(N - 1) * (T @ Asqrt @ T.T)


def kalman_gain_ens(Xp: np.ndarray, Yp: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Ensemble Kalman gain K = X' Y'^T (Y' Y'^T + (N-1) R)^{-1}, shape (n, p).

    ``Xp`` (n, N) state anomalies, ``Yp`` (p, N) obs anomalies, ``r`` (p,) error variances.
    Solved in observation space with a Cholesky factorization (p <= a few thousand)
    or through the ensemble-space identity when p > N.
    """
    N = Xp.shape[1]
    p = Yp.shape[0]
    if p <= N:
        S = Yp @ Yp.T
        S[np.diag_indices(p)] += (N - 1) * r
        c = sla.cho_factor(S, lower=True, check_finite=False)
        return sla.cho_solve(c, Yp @ Xp.T, check_finite=False).T
    # K = X' (Y'^T R^{-1} Y' + (N-1) I)^{-1} Y'^T R^{-1}  (Woodbury), N x N solve.
    C = Yp.T / r  # (N, p)
    M = C @ Yp
    M[np.diag_indices(N)] += N - 1
    c = sla.cho_factor(M, lower=True, check_finite=False)
    return Xp @ sla.cho_solve(c, C, check_finite=False)
