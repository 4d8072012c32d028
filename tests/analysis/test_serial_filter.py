"""The serial EnSRF/EAKF: against a dense one-observation-at-a-time computation written here in
Whitaker & Hamill's (2002) gain form, rows split anywhere give the same bits, adaptive inflation
through the serial scheme protocol, and bad input."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from enkflow.analysis import Inflation, Localization, ObsSet
from enkflow.analysis.serial_filter import EnSRF, factor_at_obs
from enkflow.analysis.taper import gaspari_cohn
from enkflow.config import AdaptiveTarget, AnalysisConfig, Metric, validate
from enkflow.errors import ConfigError, InputError

PERIOD = 30.0


def _problem(seed: int = 0, n: int = 30, p: int = 12, N: int = 8):
    """Rows on a ring of 30 points; observations of interpolated state at random places, two kinds
    with their own half-widths. Returns X (n, N), HX (p, N), obs, row coords (n, 1)."""
    rng = np.random.default_rng(seed)
    X = np.cumsum(rng.standard_normal((n, N)), axis=0) * 0.3 + rng.standard_normal(N)
    pos = rng.uniform(0, PERIOD, p)
    i0 = np.floor(pos).astype(int) % n
    f = (pos - np.floor(pos))[:, None]
    HX = (1 - f) * X[i0] + f * X[(i0 + 1) % n]
    truth = X.mean(axis=1) + 0.2
    y = (1 - f[:, 0]) * truth[i0] + f[:, 0] * truth[(i0 + 1) % n] + 0.3 * rng.standard_normal(p)
    hw = np.where(np.arange(p) % 2, 4.0, 6.5)
    obs = ObsSet(y, np.full(p, 0.09) * (1 + np.arange(p) % 3), pos[:, None], half_width=hw)
    return np.asfortranarray(X), HX, obs, np.arange(n, dtype=float)[:, None]


def _ring(a: np.ndarray, b: float) -> np.ndarray:
    d = np.abs(a - b)
    return np.minimum(d, PERIOD - d)


def _dense(X, HX, obs, coords, scale_x, scale_y, posterior=1.0, vertical=None):
    """One observation at a time on the augmented state [x; H(x)] with the full localized gain
    K = rho o cov(z, y) / (v + r) and Whitaker & Hamill's reduced gain alpha K for the anomalies,
    alpha = 1 / (1 + sqrt(r / (v + r))) (their eq. 13)."""
    n, N = X.shape
    Z = np.vstack([X, HX])
    m = Z.mean(axis=1)
    A = (Z - m[:, None]) * np.concatenate([np.broadcast_to(scale_x, n), np.broadcast_to(scale_y, HX.shape[0])])[:, None]
    zc = np.concatenate([coords[:, 0], obs.coords[:, 0]])
    for j in range(obs.n_obs):
        y = A[n + j].copy()
        v, r = y @ y / (N - 1), obs.error_var[j]
        rho = gaspari_cohn(_ring(zc, obs.coords[j, 0]) / obs.half_width[j])
        if vertical is not None:  # (levels of [x; H(x)], vertical half-width)
            rho = rho * gaspari_cohn(np.abs(vertical[0] - obs.vcoord[j]) / vertical[1])
        K = rho * (A @ y / (N - 1)) / (v + r)
        m = m + K * (obs.values[j] - m[n + j])
        A = A - np.outer(K, y) / (1.0 + np.sqrt(r / (v + r)))
    return m[:n, None] + posterior * A[:n]


def _filter(**kw) -> EnSRF:
    return EnSRF(localization=Localization(half_width=5.0, metric=Metric.PERIODIC, period=PERIOD), **kw)


def test_matches_the_dense_serial_update_with_inflation_and_per_kind_radii():
    X, HX, obs, coords = _problem()
    flt = _filter(inflation=Inflation(prior=1.1, posterior=1.02))
    Xa = flt.analyze(X, HX, obs, coords=coords)
    np.testing.assert_allclose(Xa, _dense(X, HX, obs, coords, 1.1, 1.1, posterior=1.02), rtol=0, atol=1e-12)
    assert Xa.flags.f_contiguous and not np.array_equal(Xa, X)
    assert flt.stats.n_domains == X.shape[0] and 0 < flt.stats.mean_local_obs < obs.n_obs


def test_vertical_localization_multiplies_the_vertical_taper():
    X, HX, obs, coords = _problem(seed=3)
    levels = np.arange(30) % 3 * 1.0
    obs = ObsSet(obs.values, obs.error_var, obs.coords, half_width=obs.half_width,
                 vcoord=np.random.default_rng(3).uniform(0, 2, obs.n_obs))
    loc = Localization(half_width=5.0, metric=Metric.PERIODIC, period=PERIOD, vertical_half_width=1.5)
    Xa = EnSRF(localization=loc).analyze(X, HX, obs, coords=np.column_stack([coords[:, 0], levels]))
    ref = _dense(X, HX, obs, coords, 1.0, 1.0, vertical=(np.concatenate([levels, obs.vcoord]), 1.5))
    np.testing.assert_allclose(Xa, ref, rtol=0, atol=1e-12)


def test_rows_split_anywhere_give_the_same_bits():
    X, HX, obs, coords = _problem(seed=1)
    flt = _filter(inflation=Inflation(rtps=0.5))
    full = flt.analyze(X, HX, obs, coords=coords)
    for cut in (1, 13, 29):
        halves = (slice(0, cut), slice(cut, None))
        parts = [flt.analyze(np.asfortranarray(X[s]), HX, obs, coords=coords[s]) for s in halves]
        assert np.array_equal(np.vstack(parts), full), cut
    # Neighbour searches of a few observations and pairs at a time: the same sequence, the same bits.
    small = EnSRF(localization=flt.localization, inflation=flt.inflation, chunk=5, max_pairs=7)
    assert np.array_equal(small.analyze(X, HX, obs, coords=coords), full)


@dataclass
class _Recorder:
    """A serial adaptive scheme for the test: keeps the prior (or adds ``step`` x weight to it) and
    records its calls."""

    step: float = 0.0
    sd: float = 0.1
    target: AdaptiveTarget = AdaptiveTarget.PRIOR
    correlation_weighted: bool = True  # DART's gamma: localization x |correlation|
    calls: list = field(default_factory=list)

    def initial_field(self, n_rows: int) -> np.ndarray:
        return np.column_stack([np.ones(n_rows), np.full(n_rows, 0.5)])

    def forecast(self, f: np.ndarray) -> np.ndarray:
        return f.copy()

    def update_serial(self, prior, weight, y_prior_var, obs_var, innovation, *, members=None):
        self.calls.append((prior.shape, weight.copy(), y_prior_var, obs_var, innovation, members))
        out = prior.copy()
        out[:, 0] += self.step * weight
        return out


def test_adaptive_factors_inflate_rows_and_observations_and_are_updated_per_observation():
    X, HX, obs, coords = _problem(seed=2)
    field0 = np.column_stack([1.0 + 0.02 * np.arange(30), np.full(30, 0.5)])
    obs_factor = factor_at_obs(field0, coords, obs, _filter().localization)
    np.testing.assert_array_equal(obs_factor, field0[np.rint(obs.coords[:, 0]).astype(int) % 30, 0])
    keep = _Recorder()
    f = field0.copy()
    Xa = _filter(adaptive=keep).analyze(X, HX, obs, coords=coords, infl_field=f, obs_factor=obs_factor)
    ref = _dense(X, HX, obs, coords, np.sqrt(field0[:, 0]), np.sqrt(obs_factor))
    np.testing.assert_allclose(Xa, ref, rtol=0, atol=1e-12)
    assert len(keep.calls) == obs.n_obs
    shape, w, yvar, r, d, members = keep.calls[0]
    y0 = HX[0] - HX[0].mean()  # the first observation's prior variance before the adaptive factor
    assert yvar == pytest.approx((y0 @ y0) / 7, rel=1e-12) and r == obs.error_var[0] and members == 8
    assert d == pytest.approx(obs.values[0] - HX[0].mean(), rel=1e-12) and ((w >= 0) & (w <= 1)).all()
    # Every observation's update of the factors takes the cycle's original prior statistics (DART's
    # orig_obs_prior_*), not those left by the observations assimilated before it.
    for j, (_, _, yvar, _, d, _) in enumerate(keep.calls):
        yj = HX[j] - HX[j].mean()
        assert yvar == pytest.approx((yj @ yj) / 7, rel=1e-12) and d == pytest.approx(obs.values[j] - HX[j].mean())
    grow = _Recorder(step=0.1)
    f = field0.copy()
    _filter(adaptive=grow).analyze(X, HX, obs, coords=coords, infl_field=f, obs_factor=obs_factor)
    assert (f[:, 0] >= field0[:, 0]).all() and (f[:, 0] > field0[:, 0]).any()
    with pytest.raises(InputError, match="inflation field"):
        _filter(adaptive=grow).analyze(X, HX, obs, coords=coords, obs_factor=obs_factor)


def test_factor_at_an_observation_beyond_every_row_is_one():
    loc = Localization(half_width=1.0)
    obs = ObsSet([0.0, 0.0], [1.0, 1.0], [[0.2], [50.0]])
    f = np.column_stack([[2.0, 3.0], [0.1, 0.1]])
    np.testing.assert_array_equal(factor_at_obs(f, np.array([[0.0], [1.0]]), obs, loc), [2.0, 1.0])


def test_bad_input_is_named():
    X, HX, obs, coords = _problem()
    with pytest.raises(InputError, match="coordinates of its state rows"):
        _filter().analyze(X, HX, obs)
    with pytest.raises(InputError, match="coords has 29 rows"):
        _filter().analyze(X, HX, obs, coords=coords[1:])
    with pytest.raises(InputError, match="outside the domain"):
        _filter().analyze(X, HX, obs, coords=coords + PERIOD)
    with pytest.raises(ConfigError, match="method 'ensrf' needs an \\[analysis.localization\\] table"):
        validate(AnalysisConfig, {"method": "ensrf"})
    with pytest.raises(ConfigError, match="max_obs caps a local filter"):
        validate(AnalysisConfig, {"method": "ensrf", "localization": {"radius": 2.0, "max_obs": 5}})
    with pytest.raises(ConfigError, match="estimates prior inflation only"):
        validate(AnalysisConfig, {"method": "ensrf", "localization": {"radius": 2.0},
                                  "inflation": {"adaptive": "anderson2009", "adaptive_target": "posterior"}})
