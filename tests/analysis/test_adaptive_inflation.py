"""Adaptive prior inflation (Miyoshi 2011): the per-domain estimate, the kernel's per-domain
inflation, and the field carried through cycles on Lorenz-96."""

from __future__ import annotations

import numpy as np
import pytest
from analysis_problems import grid_problem

from enkflow.analysis import LESTKF, LETKF, Geometry, Inflation, Kernel, LocalDomains, Localization
from enkflow.analysis.adaptive_inflation import Miyoshi2011, segment_sums
from enkflow.analysis.kernels import local_analysis
from enkflow.analysis.taper import Taper, weights
from enkflow.config import AnalysisConfig, Method
from enkflow.errors import InputError
from enkflow.models.l96_experiment import L96Setup, run


def test_segment_sums_with_empty_segments():
    v = np.arange(1.0, 8.0)
    off = np.array([0, 0, 3, 3, 3, 7, 7])
    np.testing.assert_array_equal(segment_sums(v, off), [0.0, 6.0, 0.0, 0.0, 22.0, 0.0])
    assert segment_sums(np.empty(0), np.zeros(3, np.int64)).tolist() == [0.0, 0.0]


def test_uniform_per_domain_gamma_is_bitwise_the_scalar():
    X, HX, obs, coords, _ = grid_problem(N=12, frac=0.3)
    f = LETKF(localization=Localization(half_width=3.0), inflation=Inflation(prior=1.1))
    dom = LocalDomains.per_row(coords)
    geo_out = list(f._local_obs(Geometry(f.localization.metric, obs.coords), dom))
    Yp = np.ascontiguousarray(HX - HX.mean(axis=1, keepdims=True))
    dy = obs.values - HX.mean(axis=1)
    gamma = (1 / 1.1**2) * (X.shape[1] - 1)
    a, b = np.array(X, order="F"), np.array(X, order="F")
    for sub, off, idx, wt in geo_out:
        sw = np.sqrt(wt / obs.error_var[idx])
        local_analysis(a, sub.offsets, sub.rows, off, idx, sw, Yp, dy, gamma)
        local_analysis(b, sub.offsets, sub.rows, off, idx, sw, Yp, dy, -1.0,
                       gamma_dom=np.full(sub.n_domains, gamma))
    assert np.array_equal(a, b)


def _direct_estimate(rho_b, sd, d, r, w, yvar):
    """Miyoshi (2011) eqs. for one domain, written out term by term."""
    drd = sum(wi / ri * di * di for di, ri, wi in zip(d, r, w))
    tr = sum(wi / ri * vi for vi, ri, wi in zip(yvar, r, w))
    p = sum(w)
    rho_o = (drd - p) / tr
    var_o = 2.0 / p * ((rho_b * tr + p) / tr) ** 2
    return rho_b + sd**2 / (sd**2 + var_o) * (rho_o - rho_b)


@pytest.mark.parametrize("F", [LETKF, LESTKF])
@pytest.mark.parametrize("kernel", list(Kernel))
def test_estimate_and_analysis_against_a_direct_computation(F, kernel):
    X, HX, obs, coords, _ = grid_problem(N=10, frac=0.3, std=0.3)
    c = 3.0
    ad = Miyoshi2011(initial=1.2, sd=0.3, minimum=0.1, maximum=50.0)
    f = F(localization=Localization(half_width=c), adaptive=ad, kernel=kernel)
    field = ad.initial_field(X.shape[0])
    field[::3] = 1.5  # a spatially varying prior field
    prior = field.copy()
    dom = LocalDomains.per_row(coords)
    Xa = f.analyze(X, HX, obs, domains=dom, infl_field=field)
    N = X.shape[1]
    Yp = HX - HX.mean(axis=1, keepdims=True)
    yvar = (Yp**2).sum(axis=1) / (N - 1)
    d = obs.values - HX.mean(axis=1)
    dist = np.hypot(*(obs.coords[None, :, :] - coords[:, None, :]).transpose(2, 0, 1))
    changed = 0
    for k in range(0, X.shape[0], 37):
        w = weights(Taper.GASPARI_COHN, dist[k], c)
        o = np.nonzero(w > 0)[0]
        if o.size == 0:
            assert field[k] == prior[k]
            continue
        rho_a = max(_direct_estimate(prior[k], ad.sd, d[o], obs.error_var[o], w[o], yvar[o]), ad.minimum)
        assert field[k] == pytest.approx(rho_a, rel=1e-12)
        changed += field[k] != prior[k]
        # The analysis of this row equals a fixed prior inflation of rho_a (anomalies x sqrt(rho_a)).
        g = F(localization=Localization(half_width=c), inflation=Inflation(prior=float(np.sqrt(rho_a))),
              kernel=Kernel.REFERENCE)
        one = LocalDomains.per_row(coords[k:k + 1])
        Xk = np.asfortranarray(X[k:k + 1])
        ref = g.analyze(Xk, HX, obs, domains=one)
        np.testing.assert_allclose(Xa[k], ref[0], rtol=1e-10, atol=1e-12)
    assert changed > 3


def test_adaptive_needs_its_field_and_a_local_filter():
    X, HX, obs, coords, _ = grid_problem(N=8)
    f = LETKF(localization=Localization(half_width=3.0), adaptive=Miyoshi2011())
    with pytest.raises(InputError, match="inflation field"):
        f.analyze(X, HX, obs, domains=LocalDomains.per_row(coords))
    with pytest.raises(InputError, match="not finite"):
        f.analyze(X, HX, obs, domains=LocalDomains.per_row(coords), infl_field=np.full(X.shape[0], np.nan))
    with pytest.raises(ValueError, match="needs a local filter"):
        AnalysisConfig.model_validate({"method": "etkf", "inflation": {"adaptive": "miyoshi2011"}})
    with pytest.raises(ValueError, match="adaptive_initial must lie"):
        AnalysisConfig.model_validate({"method": "etkf", "inflation": {"adaptive": "miyoshi2011",
                                                                        "adaptive_initial": 0.5}})


def test_lorenz96_adaptive_inflation_short_run():
    """A short twin experiment: the field is carried and grows from 1 where the ensemble needs
    inflation; the run stays finite and beats no inflation at all (sigma_b 0.1: a short run)."""
    none = run(L96Setup(method=Method.LETKF, members=10, cycles=600, burn_in=200))
    import dataclasses

    from enkflow.models import l96_experiment as E

    base = E.make_filter
    try:
        E.make_filter = lambda s: dataclasses.replace(base(s), adaptive=Miyoshi2011(sd=0.1))
        ad = run(L96Setup(method=Method.LETKF, members=10, cycles=600, burn_in=200, adaptive="miyoshi2011"))
    finally:
        E.make_filter = base
    assert ad.inflation_mean > 1.005
    assert np.isfinite(ad.rmse_a) and ad.rmse_a < none.rmse_a
