"""LNETF (Toedter & Ahrens 2015; DAPPER's LNETF): the vectorised per-chunk analysis against a
dense per-domain computation written out here, the rotation's properties, inflation, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.analysis import LNETF, Inflation, LocalDomains, Localization
from enkflow.analysis.adaptive_inflation import Miyoshi2011
from enkflow.analysis.factory import make_filter
from enkflow.analysis.lnetf import mean_preserving_rotation
from enkflow.apps.l96 import L96Setup
from enkflow.config import AnalysisConfig, Method, validate
from enkflow.errors import ConfigError, InputError

from analysis_problems import grid_problem

C = 2.5  # GC half-width, grid units: a few domains of the 24 x 20 grid see no observation


def gc(z):
    """Gaspari & Cohn (1999) eq. 4.10, z = distance / half-width."""
    z = np.abs(z)
    inner = -z**5 / 4 + z**4 / 2 + 5 * z**3 / 8 - 5 * z**2 / 3 + 1
    outer = z**5 / 12 - z**4 / 2 + 5 * z**3 / 8 + 5 * z**2 / 3 - 5 * z + 4 - 2 / (3 * np.maximum(z, 1e-300))
    return np.where(z <= 1, inner, np.where(z < 2, outer, 0.0))


def dense_lnetf(X, HX, obs, groups, centres, rs, prior, posterior, Q):
    """DAPPER's LNETF update, one domain at a time: members as rows, weights from the tapered,
    Rs-scaled Gaussian likelihood of the innovations, the symmetric square root of diag(w) - w w^T
    (eigh, eigenvalues clipped at 0) times sqrt(N), then posterior inflation and the rotation Q."""
    N = X.shape[1]
    E = X.T * 1.0
    mu = E.mean(axis=0)
    A = prior * (E - mu)
    Eo = HX.T
    Yo = prior * (Eo - Eo.mean(axis=0))
    Rm12 = 1.0 / np.sqrt(obs.error_var)
    out = E.copy()
    for k, centre in enumerate(centres):
        ii = np.flatnonzero(groups == k)
        taper = gc(np.linalg.norm(obs.coords - centre, axis=1) / C)
        jj = np.flatnonzero(taper > 0)
        dy = (obs.values[jj] - Eo.mean(axis=0)[jj]) * Rm12[jj] * np.sqrt(taper[jj])
        Y = Yo[:, jj] * Rm12[jj] * np.sqrt(taper[jj])
        innovs = (dy - Y) / rs
        logw = -0.5 * np.sum(innovs**2, axis=1)
        w = np.exp(logw - logw.max())
        w /= w.sum()
        vals, vecs = np.linalg.eigh(np.diag(w) - np.outer(w, w))
        sqrt = (vecs * np.sqrt(np.maximum(vals, 0))) @ vecs.T
        AT = np.sqrt(N) * sqrt @ A[:, ii]
        out[:, ii] = mu[ii] + w @ A[:, ii] + posterior * (Q @ AT)
    return np.asfortranarray(out.T)


def domains_of_pairs(coords):
    """Two neighbouring grid points per domain (domains of several rows), centred between them."""
    groups = np.arange(coords.shape[0]) // 2
    centres = np.array([coords[groups == g].mean(axis=0) for g in range(groups.max() + 1)])
    return groups, centres


@pytest.mark.parametrize("rs, rotate, prior, posterior", [(1.0, False, 1.0, 1.0), (2.0, True, 1.1, 1.0),
                                                          (1.5, True, 1.0, 1.07)])
def test_matches_the_dense_per_domain_computation(rs, rotate, prior, posterior):
    X, HX, obs, coords, _ = grid_problem()
    groups, centres = domains_of_pairs(coords)
    Q = mean_preserving_rotation(7, 4, X.shape[1]) if rotate else np.eye(X.shape[1])
    ref = dense_lnetf(X, HX, obs, groups, centres, rs, prior, posterior, Q)
    f = LNETF(localization=Localization(half_width=C), rs=rs, rotate=rotate, seed=7,
              inflation=Inflation(prior=prior, posterior=posterior), work_elements=5000)  # several slices
    out = f.analyze(X, HX, obs, domains=LocalDomains.from_groups(groups, centres), cycle=4)
    assert np.abs(out - ref).max() < 1e-10 * np.abs(ref).max()
    assert f.stats.n_domains == centres.shape[0]
    assert not np.array_equal(out, X)


def test_the_slicing_and_the_chunk_do_not_change_the_bits():
    X, HX, obs, coords, _ = grid_problem()
    dom = LocalDomains.per_row(coords)
    loc = Localization(half_width=C)
    outs = [LNETF(localization=loc, rs=1.3, rotate=True, work_elements=w, chunk=c).analyze(X, HX, obs, domains=dom, cycle=2)
            for w, c in ((1 << 22, 8192), (700, 8192), (1 << 22, 37))]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


def test_the_rotation_is_orthogonal_keeps_the_mean_and_follows_seed_and_cycle():
    Q = mean_preserving_rotation(3, 10, 9)
    np.testing.assert_allclose(Q @ Q.T, np.eye(9), atol=1e-13)
    np.testing.assert_allclose(Q @ np.ones(9), np.ones(9), atol=1e-13)
    assert np.array_equal(Q, mean_preserving_rotation(3, 10, 9))
    assert not np.allclose(Q, mean_preserving_rotation(3, 11, 9))
    assert not np.allclose(Q, mean_preserving_rotation(4, 10, 9))


def test_flat_weights_leave_the_prior():
    # Rs -> infinity: every member weighs 1/N, the transform is the identity on the anomalies.
    X, HX, obs, coords, _ = grid_problem()
    out = LNETF(localization=Localization(half_width=C), rs=1e9).analyze(X, HX, obs, domains=LocalDomains.per_row(coords))
    np.testing.assert_allclose(out, X, atol=1e-12)


def test_adaptive_prior_inflation_updates_the_field():
    X, HX, obs, coords, _ = grid_problem()
    X, HX = (np.asfortranarray(Z.mean(axis=1, keepdims=True) + 0.2 * (Z - Z.mean(axis=1, keepdims=True)))
             for Z in (X, HX))  # too little spread: the estimate grows
    field = np.column_stack((np.ones(X.shape[0]), np.full(X.shape[0], 0.6)))
    f = LNETF(localization=Localization(half_width=C), adaptive=Miyoshi2011())
    out = f.analyze(X, HX, obs, domains=LocalDomains.per_row(coords), infl_field=field)
    assert np.isfinite(out).all() and field[:, 0].max() > 1.01


def cfg(**kw):
    return AnalysisConfig.model_validate({"method": "lnetf", "localization": {"radius": 3.0}, **kw})


def test_configuration_builds_the_filter():
    f = make_filter(cfg(seed=5, lnetf={"rs": 2.5, "rotate": True}, inflation={"posterior": 1.1}))
    assert isinstance(f, LNETF) and (f.rs, f.rotate, f.seed, f.inflation.posterior) == (2.5, True, 5, 1.1)
    assert make_filter(cfg()).rs == 1.0 and Method.LNETF.is_local


@pytest.mark.parametrize("data, words", [
    ({"lnetf": {"rs": 0.0}}, "rs"),
    ({"lnetf": {"rotation": True}}, "did you mean rotate"),
    ({"kernel": "reference"}, "lnetf"),
])
def test_bad_configuration(data, words):
    with pytest.raises(ConfigError, match=words):
        validate(AnalysisConfig, {"method": "lnetf", "localization": {"radius": 3.0}, **data})


def test_bad_input():
    with pytest.raises(ConfigError, match="needs an \\[analysis.localization\\]"):
        validate(AnalysisConfig, {"method": "lnetf"})
    with pytest.raises(InputError, match="lnetf.rs"):
        LNETF(localization=Localization(half_width=C), rs=float("nan"))
    with pytest.raises(InputError, match="--rotate is an option of --method enkf-n and lnetf"):
        L96Setup(method=Method.LETKF, members=10, rotate=True)
    with pytest.raises(InputError, match="--rs must be > 0"):
        L96Setup(method=Method.LNETF, members=10, rs=-1.0)
