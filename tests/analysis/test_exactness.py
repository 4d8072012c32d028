"""Exactness: local = global with unlimited radius, ETKF = ESTKF, Kalman filter
equality in the linear-Gaussian case, stochastic EnKF convergence, compiled
kernel = LAPACK reference."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.analysis import (
    DEnKF, EnKF, ESTKF, ETKF, LESTKF, LETKF, Geometry, Inflation, Kernel, LocalDomains, Localization, ObsSet,
)
from enkflow.config import Metric, Taper

from analysis_problems import grid_problem

UNLIMITED = Localization(half_width=1e9, taper=Taper.STEP)


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize("infl", [Inflation(), Inflation(prior=1.1), Inflation(posterior=1.05, rtpp=0.3), Inflation(rtps=0.5)])
def test_local_with_unlimited_radius_equals_global(problem, infl):
    X, HX, obs, coords, _ = problem
    dom = LocalDomains.per_row(coords)
    g_etkf = ETKF(inflation=infl).analyze(X, HX, obs)
    g_estkf = ESTKF(inflation=infl).analyze(X, HX, obs)
    assert rel(g_etkf, g_estkf) < 1e-10
    for F, ref in ((LETKF, g_etkf), (LESTKF, g_estkf)):
        for kernel in Kernel:
            out = F(localization=UNLIMITED, inflation=infl, kernel=kernel).analyze(X, HX, obs, domains=dom)
            assert rel(out, ref) < 1e-10, (F.__name__, kernel)


def kalman(m, P, H, R, y):
    S = H @ P @ H.T + R
    K = P @ H.T @ np.linalg.inv(S)
    return m + K @ (y - H @ m), (np.eye(len(m)) - K @ H) @ P


def linear_gaussian(nx=6, N=20, seed=0):
    rng = np.random.default_rng(seed)
    X = np.asfortranarray(rng.standard_normal((nx, N)) * np.linspace(1, 2, nx)[:, None] + 3.0)
    H = np.zeros((4, nx))
    H[[0, 1, 2, 3], [0, 2, 3, 5]] = 1.0
    H[1, 1] = 0.5  # a non-trivial linear operator
    r = np.array([0.5, 1.0, 0.3, 2.0])
    y = rng.standard_normal(4) + 3.0
    obs = ObsSet(y, r, np.zeros((4, 1)))
    m = X.mean(axis=1)
    P = np.cov(X)
    return X, H, obs, m, P


@pytest.mark.parametrize("F", [ETKF, ESTKF])
def test_square_root_filters_equal_kalman_filter(F):
    X, H, obs, m, P = linear_gaussian()
    Xa = F().analyze(X, H @ X, obs)
    ma, Pa = kalman(m, P, H, np.diag(obs.error_var), obs.values)
    assert np.abs(Xa.mean(axis=1) - ma).max() < 1e-8
    assert np.abs(np.cov(Xa) - Pa).max() < 1e-8


def test_local_filter_equals_kalman_filter_with_unlimited_radius():
    X, H, obs, m, P = linear_gaussian()
    dom = LocalDomains.per_row(np.zeros((X.shape[0], 1)))
    Xa = LETKF(localization=UNLIMITED).analyze(X, H @ X, obs, domains=dom)
    ma, Pa = kalman(m, P, H, np.diag(obs.error_var), obs.values)
    assert np.abs(Xa.mean(axis=1) - ma).max() < 1e-8
    assert np.abs(np.cov(Xa) - Pa).max() < 1e-8


def test_denkf_mean_equals_kalman_mean():
    X, H, obs, m, P = linear_gaussian()
    Xa = DEnKF().analyze(X, H @ X, obs)
    ma, _ = kalman(m, P, H, np.diag(obs.error_var), obs.values)
    assert np.abs(Xa.mean(axis=1) - ma).max() < 1e-8


def test_stochastic_enkf_mean_approaches_kalman_mean():
    rng = np.random.default_rng(5)
    nx = 6
    m0 = np.linspace(-1, 1, nx)
    L = np.tril(rng.standard_normal((nx, nx))) * 0.4 + np.eye(nx)
    P = L @ L.T
    H = np.eye(nx)[[0, 2, 4]]
    obs = ObsSet(np.array([0.5, -0.2, 1.0]), np.array([0.3, 0.5, 0.2]), np.zeros((3, 1)))
    ma, _ = kalman(m0, P, H, np.diag(obs.error_var), obs.values)
    errs = []
    for N in (50, 500, 5000, 50000):
        X = np.asfortranarray(m0[:, None] + L @ rng.standard_normal((nx, N)))
        # Same prior statistics as the Kalman filter: recentre and rescale the sample.
        Xa = EnKF(seed=1).analyze(X, H @ X, obs)
        ref, _ = kalman(X.mean(axis=1), np.cov(X), H, np.diag(obs.error_var), obs.values)
        errs.append(np.abs(Xa.mean(axis=1) - ref).max())
    assert errs[-1] < 0.02 and errs[-1] < errs[0] / 5
    # Centred perturbations make the mean exact for any N.
    X = np.asfortranarray(m0[:, None] + L @ rng.standard_normal((nx, 30)))
    Xa = EnKF(seed=1, centred=True).analyze(X, H @ X, obs)
    ref, _ = kalman(X.mean(axis=1), np.cov(X), H, np.diag(obs.error_var), obs.values)
    assert np.abs(Xa.mean(axis=1) - ref).max() < 1e-10


CASES = {
    "obs-space (p < N)": dict(N=40, c=2.5),
    "ensemble-space (p >= N)": dict(N=8, c=4.0),
    "mixed": dict(N=20, c=3.5),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "infl", [Inflation(), Inflation(prior=1.2, posterior=1.03), Inflation(rtpp=0.4), Inflation(rtps=0.7, prior=1.05)]
)
def test_compiled_kernel_equals_lapack_reference(case, infl):
    cfg = CASES[case]
    X, HX, obs, coords, _ = grid_problem(N=cfg["N"], frac=0.3)
    loc = Localization(half_width=cfg["c"])
    dom = LocalDomains.per_row(coords)
    for F in (LETKF, LESTKF):
        a = F(localization=loc, inflation=infl).analyze(X, HX, obs, domains=dom)
        b = F(localization=loc, inflation=infl, kernel=Kernel.REFERENCE).analyze(X, HX, obs, domains=dom)
        assert rel(a, b) < 1e-10


@pytest.mark.parametrize("taper", list(Taper))
def test_grouped_domains_and_tapers(taper):
    X, HX, obs, coords, _ = grid_problem(N=16)
    # 2x2 tiles of points share an analysis; several rows per domain.
    tile = (coords[:, 0] // 2) * 100 + coords[:, 1] // 2
    _, group = np.unique(tile, return_inverse=True)
    centres = np.array([coords[group == g].mean(axis=0) for g in range(group.max() + 1)])
    dom = LocalDomains.from_groups(group, centres)
    loc = Localization(half_width=3.0, taper=taper)
    a = LETKF(localization=loc).analyze(X, HX, obs, domains=dom)
    b = LETKF(localization=loc, kernel=Kernel.REFERENCE).analyze(X, HX, obs, domains=dom)
    assert rel(a, b) < 1e-10


def test_sphere_and_periodic_metrics():
    rng = np.random.default_rng(2)
    lon, lat = np.meshgrid(np.arange(-180, 180, 10.0), np.arange(-85, 90, 10.0), indexing="ij")
    coords = np.column_stack((lon.ravel(), lat.ravel()))
    X = np.asfortranarray(rng.standard_normal((coords.shape[0], 10)))
    where = rng.choice(coords.shape[0], 60, replace=False)
    obs = ObsSet(rng.standard_normal(60), np.full(60, 0.5), coords[where])
    loc = Localization(half_width=1500.0, metric=Metric.SPHERE)
    dom = LocalDomains.per_row(coords)
    a = LETKF(localization=loc).analyze(X, X[where], obs, domains=dom)
    b = LETKF(localization=loc, kernel=Kernel.REFERENCE).analyze(X, X[where], obs, domains=dom)
    assert rel(a, b) < 1e-10
    assert not np.allclose(a, X)
    # Periodic ring: the point at 0 sees observations at 39 (distance 1).
    n = 40
    ring = np.arange(n, dtype=float)
    geo = Geometry(Metric.PERIODIC, np.array([[39.0]]), period=float(n))
    nb = geo.neighbours(np.array([[0.0]]), 1.5)
    assert nb.idx.tolist() == [0] and np.isclose(nb.dist[0], 1.0)
    X = np.asfortranarray(rng.standard_normal((n, 10)))
    obs = ObsSet(rng.standard_normal(n), np.ones(n), ring)
    loc = Localization(half_width=3.0, metric=Metric.PERIODIC, period=float(n))
    a = LETKF(localization=loc).analyze(X, X, obs, domains=LocalDomains.per_row(ring))
    b = LETKF(localization=loc, kernel=Kernel.REFERENCE).analyze(X, X, obs, domains=LocalDomains.per_row(ring))
    assert rel(a, b) < 1e-10


def test_domains_without_observations_keep_prior_except_prior_inflation(problem):
    X, HX, obs, coords, _ = problem
    far = ObsSet(obs.values[:1], obs.error_var[:1], np.array([[1000.0, 1000.0]]))
    loc = Localization(half_width=1.0)
    dom = LocalDomains.per_row(coords)
    assert np.allclose(LETKF(localization=loc).analyze(X, HX[:1], far, domains=dom), X, rtol=0, atol=1e-12)
    out = LETKF(localization=loc, inflation=Inflation(prior=1.5)).analyze(X, HX[:1], far, domains=dom)
    mean = X.mean(axis=1, keepdims=True)
    assert np.allclose(out, mean + 1.5 * (X - mean), rtol=0, atol=1e-12)


def test_bitwise_reproducible(problem):
    X, HX, obs, coords, _ = problem
    loc = Localization(half_width=3.0)
    dom = LocalDomains.per_row(coords)
    a = LETKF(localization=loc).analyze(X, HX, obs, domains=dom)
    b = LETKF(localization=loc).analyze(X, HX, obs, domains=dom)
    assert a.tobytes() == b.tobytes()
    # Chunking changes which domains share SIMD lanes (and so, near p = N, the
    # route of a batch): the same analysis up to rounding.
    c = LETKF(localization=loc, chunk=37).analyze(X, HX, obs, domains=dom)
    assert rel(c, a) < 1e-12
