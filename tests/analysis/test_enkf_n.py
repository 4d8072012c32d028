"""The finite-size EnKF (EnKF-N) against an independent dense computation: the dual cost written out
as DAPPER's EnKF_N defines it, minimised by a bounded scalar search, and the Kalman update of the
prior inflated by the factor found, solved in observation space."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from scipy.optimize import minimize_scalar

from enkflow.analysis import EnKFN, Inflation, ObsSet
from enkflow.analysis.enkf_n import mean_preserving_rotation
from enkflow.config import AnalysisConfig
from enkflow.errors import InputError


def _problem(n=30, N=8, p=12, seed=5, miss=1.0):
    rng = np.random.default_rng(seed)
    X = np.asfortranarray(rng.standard_normal((n, 1)) + 0.7 * rng.standard_normal((n, N)))
    where = rng.choice(n, p, replace=False)
    r = rng.uniform(0.3, 2.0, p)
    obs = ObsSet(X[where].mean(axis=1) + miss * rng.standard_normal(p), r, np.arange(p, dtype=float)[:, None])
    return X, X[where].copy(), obs


def _dense_l1(HX, obs, xn, g):
    """The dual cost's minimiser, from DAPPER's formulas with dense matrices (no SVD)."""
    N = HX.shape[1]
    N1 = N - 1
    Rih = 1.0 / np.sqrt(obs.error_var)
    S = (HX - HX.mean(axis=1, keepdims=True)) * Rih[:, None]
    d = (obs.values - HX.mean(axis=1)) * Rih
    eig = np.linalg.eigvalsh(S.T @ S)  # the N eigenvalues of Y'^T R^-1 Y', zeros included
    eN, cL = (N + 1) / N, (N + g) / N1
    mc = np.sqrt((eN / cL) ** (N1 * np.mean(1.0 / (eig + N1))))
    eN, cL = xn * eN / mc, xn * cL * mc

    def J(l1):  # the data term differs from DAPPER's by a constant (the innovation outside S's range)
        return d @ np.linalg.solve(l1**2 * S @ S.T + N1 * np.eye(S.shape[0]), d) + eN / l1**2 + cL * np.log(l1**2)

    return minimize_scalar(J, bounds=(0.2, 5.0), method="bounded", options={"xatol": 1e-10}).x


def _dense_analysis(X, HX, obs, l1):
    """Kalman update of the prior with anomalies multiplied by l1; symmetric square root anomalies."""
    N1 = X.shape[1] - 1
    Xp = l1 * (X - X.mean(axis=1, keepdims=True))
    Yp = l1 * (HX - HX.mean(axis=1, keepdims=True))
    K = Xp @ Yp.T @ np.linalg.inv(Yp @ Yp.T + N1 * np.diag(obs.error_var))
    xa = X.mean(axis=1) + K @ (obs.values - HX.mean(axis=1))
    T = np.real(sla.sqrtm(np.linalg.inv(np.eye(N1 + 1) + Yp.T @ np.diag(1.0 / obs.error_var) @ Yp / N1)))
    return xa[:, None] + Xp @ T


@pytest.mark.parametrize("p, miss, xn, g", [(12, 1.0, 1.0, 0), (12, 3.0, 2.0, 0), (5, 1.0, 1.0, 3)],
                         ids=["p>N", "far,xn=2", "p<N,g=3"])
def test_the_dual_form_matches_the_dense_computation(p, miss, xn, g):
    X, HX, obs = _problem(p=p, miss=miss)
    f = EnKFN(xn=xn, g=g)
    Yp = HX - HX.mean(axis=1, keepdims=True)
    l1 = f.dual_cost(Yp, obs.values - HX.mean(axis=1), obs.error_var).minimiser()
    assert l1 == pytest.approx(_dense_l1(HX, obs, xn, g), abs=1e-7)
    np.testing.assert_allclose(f.analyze(X, HX, obs), _dense_analysis(X, HX, obs, l1), rtol=0, atol=1e-11)


def test_the_rotation_keeps_mean_and_covariance_and_is_drawn_from_seed_and_cycle():
    X, HX, obs = _problem()
    plain = EnKFN(xn=2.0).analyze(X, HX, obs, cycle=4)
    rot = EnKFN(xn=2.0, rotate=True, seed=7)
    a, b = rot.analyze(X, HX, obs, cycle=4), rot.analyze(X, HX, obs, cycle=5)
    np.testing.assert_allclose(a.mean(axis=1), plain.mean(axis=1), atol=1e-12)
    np.testing.assert_allclose(np.cov(a), np.cov(plain), atol=1e-12)
    assert np.abs(a - plain).max() > 0.1 and np.abs(a - b).max() > 0.1
    assert rot.analyze(X, HX, obs, cycle=4).tobytes() == a.tobytes()
    Q = mean_preserving_rotation(6, np.random.default_rng(0))
    np.testing.assert_allclose(Q @ Q.T, np.eye(6), atol=1e-14)
    np.testing.assert_allclose(Q @ np.ones(6), np.ones(6), atol=1e-14)


def test_prior_inflation_acts_before_the_estimate_and_posterior_after():
    X, HX, obs = _problem()
    lam, post = 1.3, 1.1
    xbar, hbar = X.mean(axis=1, keepdims=True), HX.mean(axis=1, keepdims=True)
    prior_scaled = EnKFN().analyze(np.asfortranarray(xbar + lam * (X - xbar)), hbar + lam * (HX - hbar), obs)
    np.testing.assert_allclose(EnKFN(inflation=Inflation(prior=lam)).analyze(X, HX, obs), prior_scaled, atol=1e-11)
    plain = EnKFN().analyze(X, HX, obs)
    m = plain.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(EnKFN(inflation=Inflation(posterior=post)).analyze(X, HX, obs),
                               m + post * (plain - m), atol=1e-12)


@pytest.mark.parametrize("kw, item", [({"xn": 0.0}, "enkf_n.xn"), ({"xn": np.nan}, "enkf_n.xn"),
                                      ({"g": -1}, "enkf_n.g")])
def test_bad_options_are_input_errors(kw, item):
    with pytest.raises(InputError, match=item) as ei:
        EnKFN(**kw)
    assert ei.value.item == item


def test_the_configuration_makes_the_filter():
    from enkflow.analysis.factory import make_filter

    cfg = AnalysisConfig.model_validate({"method": "enkf-n", "seed": 3, "enkf_n": {"xn": 2.0, "g": 1, "rotate": True},
                                         "inflation": {"posterior": 1.02}})
    f = make_filter(cfg)
    assert (f.xn, f.g, f.rotate, f.seed, f.inflation.posterior) == (2.0, 1, True, 3, 1.02)
    assert make_filter(AnalysisConfig.model_validate({"method": "enkf-n"})) == EnKFN()


def test_l96_rejects_a_bad_xn():
    from enkflow.apps.l96 import L96Setup
    from enkflow.config import Method

    with pytest.raises(InputError, match="--xn must be a finite number > 0") as ei:
        L96Setup(method=Method.ENKF_N, members=10, xn=-1.0)
    assert ei.value.item == "xn"
    with pytest.raises(InputError, match="--xn is an option of --method enkf-n, not letkf"):
        L96Setup(method=Method.LETKF, members=10, xn=2.0)
