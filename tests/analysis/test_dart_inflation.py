"""DART's adaptive inflation schemes: El Gharamti (2018, inverse gamma) and Anderson (2009,
Gaussian). One observation against the papers' formulas written out here, the bounds, the
damping and the deviation's rules, the local filters' per-domain update against a dense
computation, the field carried through its files, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from analysis_problems import grid_problem

from enkflow.analysis import LETKF, Geometry, Inflation, Kernel, LocalDomains, Localization
from enkflow.analysis.adaptive_inflation import from_config
from enkflow.analysis.inflation_anderson import Anderson2009
from enkflow.analysis.inflation_gharamti import Gharamti2018, inverse_gamma
from enkflow.analysis.taper import Taper, weights
from enkflow.apps.l96 import L96Setup
from enkflow.config import AdaptiveTarget, AnalysisConfig, InflationConfig, Method
from enkflow.errors import ConfigError, InputError


def _lik(lam, gamma, sp2, so2, d, inv_n=0.0):
    """N(d; 0, theta^2), theta^2 = ((1 + gamma (sqrt(lam) - 1))^2 - 1/N) sp2 + so2 (Anderson 2009 eq. 4; El Gharamti's -1/N)."""
    f = (1 + gamma * (math.sqrt(lam) - 1)) ** 2
    t2 = (f - inv_n if f >= inv_n else f) * sp2 + so2
    return math.exp(-d * d / (2 * t2)) / math.sqrt(2 * math.pi * t2)


def _lik_and_slope(lam, *args):
    """l(lam) and l'(lam) by a central difference (independent of the schemes' analytic slope)."""
    h = 1e-6 * lam
    return _lik(lam, *args), (_lik(lam + h, *args) - _lik(lam - h, *args)) / (2 * h)


def _mode(coeffs, product):
    """The real root of the quadratic ``coeffs`` where ``product`` (prior x linearised likelihood) is largest."""
    roots = np.roots(coeffs)
    roots = roots[np.isreal(roots)].real
    return max(roots, key=product)


CASES = [  # lambda_b, sigma_b, gamma, sigma_p^2, sigma_o^2, d
    (1.0, 0.8, 1.0, 0.5, 1.0, 2.1),
    (1.3, 0.7, 0.6, 2.0, 0.5, 0.3),
    (1.1, 0.9, 0.3, 1.0, 1.0, -3.0),
    (1.0, 0.6, 1.0, 1.0, 0.5, 5.0),  # steep: DART's root nearest lambda_b would be the product's minimum
]


@pytest.mark.parametrize("lam_b, sd_b, gamma, sp2, so2, d", CASES)
def test_gharamti_one_observation_against_the_paper(lam_b, sd_b, gamma, sp2, so2, d):
    N = 10
    alpha, beta = (float(v[0]) for v in inverse_gamma(np.array([lam_b]), np.array([sd_b])))
    # The inverse gamma of the carried mode and deviation: mode beta/(alpha+1), variance beta^2/((alpha-1)^2 (alpha-2)).
    assert beta / (alpha + 1) == pytest.approx(lam_b, rel=1e-12)
    assert beta**2 / ((alpha - 1) ** 2 * (alpha - 2)) == pytest.approx(sd_b**2, rel=1e-10)
    # Mode of IG x linearised likelihood: (1 - lam_b/beta) lam^2 + (l/l' - 2 lam_b) lam + lam_b^2 - lam_b l/l' = 0.
    lb, lp = _lik_and_slope(lam_b, gamma, sp2, so2, d, 1 / N)
    r = lb / lp
    lam_u = _mode([1 - lam_b / beta, r - 2 * lam_b, lam_b**2 - lam_b * r],
                  lambda x: x ** (-alpha - 1) * math.exp(-beta / x) * (lb + lp * (x - lam_b)) if x > 0 else -1.0)

    def post(x):  # the exact posterior density, up to its constant
        return x ** (-alpha - 1) * math.exp(-beta / x) * _lik(x, gamma, sp2, so2, d, 1 / N)

    ratio = post(lam_u + sd_b) / post(lam_u)
    omega = (math.log(lam_u) - math.log(lam_u + sd_b)) / lam_u + 1 / lam_u - 1 / (lam_u + sd_b)
    beta_u = math.log(ratio) / omega
    alpha_u = beta_u / lam_u - 1
    sd_u = math.sqrt(beta_u**2 / ((alpha_u - 1) ** 2 * (alpha_u - 2))) if alpha_u > 2 else sd_b
    sd_u = sd_b if sd_u > 1.05 * sd_b else sd_u
    g = Gharamti2018(sd=0.1, minimum=0.0, maximum=50.0)
    out = g.update_serial(np.array([[lam_b, sd_b]]), np.array([gamma]), sp2, so2, d, members=N)
    assert out[0, 0] == pytest.approx(lam_u, rel=1e-7) and out[0, 0] != lam_b
    assert out[0, 1] == pytest.approx(sd_u, rel=1e-6)


@pytest.mark.parametrize("lam_b, sd_b, gamma, sp2, so2, d", CASES)
def test_anderson_one_observation_against_the_paper(lam_b, sd_b, gamma, sp2, so2, d):
    lb, lp = _lik_and_slope(lam_b, gamma, sp2, so2, d)
    r = lb / lp
    # The Gaussian prior times the linearised likelihood: lam^2 + (l/l' - 2 lam_b) lam + lam_b^2 - sd^2 - lam_b l/l' = 0.
    def product(x):
        return np.exp(-((x - lam_b) ** 2) / (2 * sd_b**2)) * (lb + lp * (x - lam_b))

    lam_u = _mode([1.0, r - 2 * lam_b, lam_b**2 - sd_b**2 - lam_b * r], product)
    grid = lam_u + np.linspace(-1e-3, 1e-3, 2001)  # the maximum of that product
    assert abs(grid[np.argmax(product(grid))] - lam_u) <= 1e-6

    def post(x):
        return math.exp(-((x - lam_b) ** 2) / (2 * sd_b**2)) * _lik(x, gamma, sp2, so2, d)

    ratio = post(lam_u + sd_b) / post(lam_u)
    sd_u = math.sqrt(-(sd_b**2) / (2 * math.log(ratio))) if ratio <= 0.99 else sd_b
    sd_u = min(sd_u, sd_b)
    a = Anderson2009(sd=0.1, minimum=0.0)
    out = a.update_serial(np.array([[lam_b, sd_b]]), np.array([gamma]), sp2, so2, d)
    assert out[0, 0] == pytest.approx(lam_u, rel=1e-7) and out[0, 0] != lam_b
    assert out[0, 1] == pytest.approx(sd_u, rel=1e-6)


@pytest.mark.parametrize("cls", [Gharamti2018, Anderson2009])
def test_bounds_damping_and_the_deviation_rules(cls):
    s = cls(minimum=1.0, maximum=1.05, damping=0.9, sd=0.3, sd_initial=0.6)
    field = s.initial_field(4)
    assert (field == [1.0, 0.6]).all()
    prior = np.array([[1.0, 0.6], [1.02, 0.3], [1.0, 0.6], [1.04, 0.5]])
    gamma = np.array([1.0, 1.0, 0.0, 1.0])
    out = s.update_serial(prior, gamma, 1.0, 0.5, 5.0)  # a large innovation: more inflation
    assert out[0, 0] == 1.05 and out[3, 0] == 1.05  # clipped to the maximum
    assert out[1, 1] == 0.3  # a deviation at its lower bound stays there
    assert (out[2] == prior[2]).all()  # gamma 0 changes nothing
    low = s.update_serial(prior, gamma, 1.0, 0.5, 0.0)  # no innovation: less inflation
    assert low[0, 0] == 1.0  # clipped to the minimum
    f = s.forecast(np.array([[1.5, 0.1], [0.8, 0.7]]))
    np.testing.assert_allclose(f, [[1.45, 0.3], [0.82, 0.7]], rtol=1e-15)  # damped towards 1; sd >= its bound
    assert cls(damping=1.0).forecast(prior)[:, 0].tolist() == prior[:, 0].tolist()


def test_gharamti_deviation_may_grow_by_at_most_sd_max_change():
    sd = [Gharamti2018(sd=0.1, sd_max_change=m).update_serial(np.array([[1.0, 0.5]]), np.ones(1), 0.5, 1.0, d,
                                                               members=20)[0, 1] for m, d in ((1.05, 0.0), (1.2, 2.5), (1.05, 2.5))]
    assert sd[0] < 0.5 < 0.5 * 1.05 < sd[1] < 0.5 * 1.2 and sd[2] == 0.5  # a larger growth keeps the deviation
    assert Anderson2009(sd=0.1).update_serial(np.array([[1.0, 0.5]]), np.ones(1), 0.5, 1.0, 4.0)[0, 1] <= 0.5


@pytest.mark.parametrize("cls, target", [(Gharamti2018, AdaptiveTarget.PRIOR), (Anderson2009, AdaptiveTarget.POSTERIOR)])
def test_local_domains_against_a_dense_computation(cls, target):
    """Each row's domain assimilates its local observations in turn with gamma = taper weight x
    |correlation| (computed densely here); a prior factor is the analysis with that fixed prior
    inflation, a posterior one scales that analysis' anomalies by its square root."""
    X, HX, obs, coords, _ = grid_problem(nx=12, ny=10, N=8, frac=0.3, std=0.3)
    c = 2.0
    sch = cls(sd=0.1, sd_initial=0.8, minimum=0.2, target=target)
    f = LETKF(localization=Localization(half_width=c), adaptive=sch, kernel=Kernel.REFERENCE)
    field = sch.initial_field(X.shape[0])
    field[::3, 0] = 1.3
    prior = field.copy()
    Xa = f.analyze(X, HX, obs, domains=LocalDomains.per_row(coords), infl_field=field)
    N = X.shape[1]
    Yp = HX - HX.mean(axis=1, keepdims=True)
    A = X - X.mean(axis=1, keepdims=True)
    corr = np.abs(A @ Yp.T) / np.outer(np.linalg.norm(A, axis=1), np.linalg.norm(Yp, axis=1))
    d = obs.values - HX.mean(axis=1)
    dist = np.hypot(*(obs.coords[None, :, :] - coords[:, None, :]).transpose(2, 0, 1))
    geo = Geometry(f.localization.metric, obs.coords)
    order = {int(k): o for sub, off, idx, _ in f._local_obs(geo, LocalDomains.per_row(coords))
             for k, o in zip(sub.rows, np.split(idx, off[1:-1]))}
    plain = LETKF(localization=Localization(half_width=c), kernel=Kernel.REFERENCE)
    for k in range(0, X.shape[0], 23):
        w = weights(Taper.GASPARI_COHN, dist[k], c)
        p = prior[k:k + 1]
        for o in order[k]:  # the search's order of the domain's observations
            p = sch.update_serial(p, np.array([w[o] * corr[k, o]]), float((Yp[o] ** 2).sum() / (N - 1)),
                                  float(obs.error_var[o]), float(d[o]), members=N)
        np.testing.assert_allclose(field[k], p[0], rtol=1e-12)
        one, Xk = LocalDomains.per_row(coords[k:k + 1]), np.asfortranarray(X[k:k + 1])
        if target is AdaptiveTarget.PRIOR:
            ref = LETKF(localization=Localization(half_width=c), kernel=Kernel.REFERENCE,
                        inflation=Inflation(prior=float(np.sqrt(p[0, 0])))).analyze(Xk, HX, obs, domains=one)[0]
        else:
            a = plain.analyze(Xk, HX, obs, domains=one)[0]
            ref = a.mean() + np.sqrt(p[0, 0]) * (a - a.mean())
        np.testing.assert_allclose(Xa[k], ref, rtol=1e-10, atol=1e-12)
    assert (field[:, 0] != prior[:, 0]).sum() > 10


def test_the_field_is_carried_through_its_files_damped(tmp_path):
    from enkflow.experiment.inflation import InflationCarrier
    from enkflow.parallel import SerialComm

    g = Gharamti2018(damping=0.8)
    dir_of = lambda c: tmp_path / f"{c:04d}"  # noqa: E731
    a = InflationCarrier(g, 5, SerialComm(), dir_of=dir_of, first_cycle=0)
    np.testing.assert_array_equal(a.prior(0, 0, 5), g.initial_field(5))
    post = np.column_stack([np.linspace(0.9, 1.4, 5), np.linspace(0.6, 0.9, 5)])
    a.posterior(0, post)
    mem = a.prior(1, 0, 5)
    np.testing.assert_allclose(mem[:, 0], 1 + 0.8 * (post[:, 0] - 1), rtol=1e-15)
    np.testing.assert_array_equal(InflationCarrier(g, 5, SerialComm(), dir_of=dir_of).prior(1, 1, 5), mem[1:])


def test_config_defaults_keys_and_bad_input():
    assert from_config(InflationConfig(adaptive="gharamti2018")) == Gharamti2018()
    assert from_config(InflationConfig(adaptive="anderson2009", adaptive_damping=1.0, adaptive_target="posterior",
                                       adaptive_maximum=5.0)) == Anderson2009(damping=1.0, maximum=5.0,
                                                                              target=AdaptiveTarget.POSTERIOR)
    loc = {"radius": 3.0}
    bad = [({"adaptive": "anderson2009", "adaptive_minimum": 2.0, "adaptive_maximum": 1.5},
            r"adaptive_minimum \(2.0\) is above adaptive_maximum \(1.5\)"),
           ({"adaptive": "gharamti2018", "adaptive_initial": 60.0}, r"adaptive_initial \(60.0\) must lie in .*\[1.0, 50.0\]"),
           ({"adaptive": "miyoshi2011", "adaptive_damping": 0.9}, "adaptive_damping is not a parameter of adaptive = 'miyoshi2011'"),
           ({"adaptive": "miyoshi2011", "adaptive_target": "posterior"}, "prior inflation only"),
           ({"adaptive": "anderson2009", "adaptive_sd_max_change": 1.1}, "adaptive_sd_max_change is not a parameter"),
           ({"adaptive": "gharamti2018", "adaptive_relax": 0.1}, "adaptive_relax is miyoshi2011's"),
           ({"adaptive": "gharamti2018", "adaptive_damping": 1.5}, "less than or equal to 1"),
           ({"adaptive": "gharamti2018", "adaptive_target": "both"}, "'prior' or 'posterior'")]
    for infl, msg in bad:
        with pytest.raises(ValueError, match=msg):
            AnalysisConfig.model_validate({"method": "letkf", "localization": loc, "inflation": infl})
    with pytest.raises(InputError, match="adaptive_sd_max_change"):
        Gharamti2018(sd_max_change=3.0)
    with pytest.raises(InputError, match=r"adaptive_minimum \(2.0\) is above adaptive_maximum \(1.0\)"):
        Anderson2009(minimum=2.0, maximum=1.0, initial=1.5)
    with pytest.raises(ConfigError, match=r"adaptive_damping is not a parameter of adaptive = 'miyoshi2011' \(key 'analysis.inflation'\)"):
        L96Setup(method=Method.LETKF, members=4, adaptive="miyoshi2011", adaptive_damping=0.5)
    with pytest.raises(InputError, match="--adaptive must be one of none, miyoshi2011, gharamti2018, anderson2009"):
        L96Setup(method=Method.LETKF, members=4, adaptive="gharamti")
    with pytest.raises(InputError, match="weight has shape"):
        Anderson2009().update_serial(np.ones((3, 2)), np.ones(2), 1.0, 1.0, 0.5)
