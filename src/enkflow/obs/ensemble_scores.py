"""Probabilistic scores of an ensemble of H(x) against the observations: the ensemble CRPS and the rank
of each observation in the prior ensemble perturbed with the observation error.

Both are per observation, from ``HX`` (n_obs, N) and ``y`` (n_obs,), in the observation's units.
"""

from __future__ import annotations

import numpy as np

from enkflow.obs.gathered import sorted_ids

# The perturbations of cycle k are drawn from numpy's PCG64 seeded by SeedSequence([RANK_SEED, k]):
# the same on every rank and in every mode, and reproducible outside enkflow (ObsRankGenerator).
RANK_SEED = 0x656E6B66  # "enkf"
RANK_METHOD = ("number of prior members j with H(x_j) + e_j < y, e_j ~ N(0, obs_error_variance) drawn from "
               f"numpy.random.Generator(PCG64(SeedSequence([{RANK_SEED}, cycle]))).standard_normal((n_obs, N)) "
               "times the observation error standard deviation (Hamill 2001; DART obs_diag)")
DRAW_ROWS = 65536  # observations per block of the stream drawn for a subset of them


def ensemble_crps(HX: np.ndarray, y: np.ndarray, ids: np.ndarray | None = None,
                  n_total: int | None = None) -> np.ndarray:
    """The ensemble CRPS of each row of ``HX`` (n_obs, N) against ``y`` (n_obs,): mean_j |x_j - y| -
    0.5 mean_{j,l} |x_j - x_l| (``properscoring.crps_ensemble``'s definition), (n_obs,) float64.
    ``ids``, ``n_total``: these are the observations ``ids`` (sorted) of the cycle's ``n_total``, each
    scored to the bits of the whole cycle's call (:func:`_pair_sums`).

    The pair sum in O(N log N): with the members sorted, sum_{j,l} |x_j - x_l| = 2 sum_i (2i - N - 1) x_(i)
    (i = 1..N). The departures from ``y`` are sorted instead of the members (the pair sum does not change
    with a shift), so that a large offset of the values does not cost precision."""
    X = np.asarray(HX, dtype=np.float64)
    n = X.shape[1]
    d = np.sort(X - np.asarray(y, dtype=np.float64).reshape(-1, 1), axis=1)
    w = 2.0 * np.arange(1, n + 1, dtype=np.float64) - n - 1.0
    pairs = d @ w if ids is None else _pair_sums(d, w, _owned_ids(ids, d.shape[0], _total(n_total)), _total(n_total))
    return np.abs(d).mean(axis=1) - pairs / float(n * n)


# BLAS's matrix-vector product (OpenBLAS's dgemv_t on x86-64, Haswell's kernel) takes the rows 4 at a time from
# the first, and the last n % 4 with other kernels that round differently: a row's bits depend on its place in
# the matrix. Rows are scored in blocks of GEMV_ROWS at their places, and the file's last rows together, so any
# row blocking by a power of two up to GEMV_ROWS (other CPUs' kernels) keeps the whole matrix's bits too. (One
# BLAS thread, as enkflow runs: threads split the rows again.)
GEMV_ROWS = 64


def _total(n_total: int | None) -> int:
    if n_total is None:
        raise ValueError("observation ids need n_total, the number of the cycle's observations they index")
    return n_total


def _pair_sums(d: np.ndarray, w: np.ndarray, ids: np.ndarray, n_total: int) -> np.ndarray:
    """``d @ w`` (n,) for the rows ``ids`` (n,) of a cycle's (n_total, N) matrix, each with the bits of the
    whole matrix's product: a row of a whole block of GEMV_ROWS at its place in a block of zeros; the rows
    of the last block and the remainder after it in a matrix of those last rows."""
    end = n_total - n_total % GEMV_ROWS
    if end < n_total and end >= GEMV_ROWS:
        end -= GEMV_ROWS  # a remainder goes through the kernels it takes after a whole block (one row alone: ddot)
    out = np.empty(ids.size)
    body = ids < end
    at = ids[body]
    blocks, inv = np.unique(at // GEMV_ROWS, return_inverse=True)
    rows = inv * GEMV_ROWS + at % GEMV_ROWS
    D = np.zeros((blocks.size * GEMV_ROWS, d.shape[1]))
    D[rows] = d[body]
    out[body] = (D @ w)[rows]
    tail = ~body
    if tail.any():
        T = np.zeros((n_total - end, d.shape[1]))
        T[ids[tail] - end] = d[tail]
        out[tail] = (T @ w)[ids[tail] - end]
    return out


def observation_perturbations(cycle: int, error_var: np.ndarray, n_members: int, ids: np.ndarray | None = None,
                              n_total: int | None = None) -> np.ndarray:
    """The observation-error draws e (n_obs, N) of ``cycle`` that :func:`prior_ranks` adds to the prior
    members (:data:`RANK_METHOD`); ``error_var`` (n_obs,) the observation error variances.

    With ``ids`` (n_obs,) sorted global indices out of the cycle's ``n_total`` observations (those a rank
    owns) and ``error_var`` theirs: the rows of those observations of the stream drawn for all
    ``n_total``, the same bits as the rows of the whole draw. The stream is drawn in blocks of
    :data:`DRAW_ROWS` observations up to the last id, so memory is O((n_obs + DRAW_ROWS) N)."""
    if cycle < 0:
        raise ValueError(f"cycle {cycle}: the rank histogram's generator is seeded by a cycle number >= 0")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([RANK_SEED, cycle])))
    sd = np.sqrt(np.asarray(error_var, dtype=np.float64)).reshape(-1, 1)
    if ids is None:
        return rng.standard_normal((sd.shape[0], n_members)) * sd
    total = _total(n_total)
    return _draw_rows(rng, _owned_ids(ids, sd.shape[0], total), total, n_members) * sd


def _draw_rows(rng: np.random.Generator, rows: np.ndarray, n_total: int, n_members: int) -> np.ndarray:
    """The ``rows`` (sorted) of ``rng.standard_normal((n_total, n_members))``, drawn block by block."""
    e = np.empty((rows.size, n_members))
    # Each block continues the generator's stream, so the blocks together are the one draw of
    # (n_total, N): the normals are drawn one after another in C order (checked by the tests).
    for start in range(0, int(rows[-1]) + 1 if rows.size else 0, DRAW_ROWS):
        block = rng.standard_normal((min(DRAW_ROWS, n_total - start), n_members))
        lo, hi = np.searchsorted(rows, (start, start + block.shape[0]))
        e[lo:hi] = block[rows[lo:hi] - start]
    return e


def _owned_ids(ids: np.ndarray, n_obs: int, n_total: int) -> np.ndarray:
    """``ids`` as int64, checked: n_obs of them, strictly increasing, within 0..n_total-1."""
    rows = sorted_ids(np.asarray(ids).reshape(-1), n_total)
    if rows.size != n_obs:
        raise ValueError(f"{rows.size} observation ids for {n_obs} observations")
    return rows


def prior_ranks(HX: np.ndarray, y: np.ndarray, error_var: np.ndarray, cycle: int, ids: np.ndarray | None = None,
                n_total: int | None = None) -> np.ndarray:
    """The rank of each observation ``y`` (n_obs,) among the prior members ``HX`` (n_obs, N) perturbed with
    the observation error of variance ``error_var`` (n_obs,): int32 in 0..N (:data:`RANK_METHOD`).
    ``ids``, ``n_total``: these are the observations ``ids`` of the cycle's ``n_total``
    (:func:`observation_perturbations`)."""
    X = np.asarray(HX, dtype=np.float64)
    e = observation_perturbations(cycle, error_var, X.shape[1], ids, n_total)
    return np.count_nonzero(X + e < np.asarray(y, dtype=np.float64).reshape(-1, 1), axis=1).astype(np.int32)
