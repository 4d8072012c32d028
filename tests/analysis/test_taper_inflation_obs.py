"""Tapers and radius conventions, inflation, observation operators."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.analysis import Geometry, Inflation, Localization, inflate_posterior
from enkflow.analysis.taper import gaspari_cohn, weights
from enkflow.config import Metric, RadiusConvention, Taper
from enkflow.obs import LinearObsOperator
from enkflow.parallel import SerialComm


def test_gaspari_cohn_values():
    r = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    w = gaspari_cohn(r)
    assert w[0] == 1.0 and w[4] == 0.0 and w[5] == 0.0
    assert np.isclose(w[2], 5.0 / 24.0)  # GC(1) = 0.2083
    # Continuous and non-increasing across r = 1 and up to 2.
    x = np.linspace(0, 2, 2001)
    g = gaspari_cohn(x)
    assert np.all(np.diff(g) <= 1e-15) and abs(gaspari_cohn(np.array([1 - 1e-9]))[0] - gaspari_cohn(np.array([1 + 1e-9]))[0]) < 1e-8


def test_radius_conventions():
    a = Localization.from_radius(10.0, RadiusConvention.CUTOFF)
    b = Localization.from_radius(5.0, RadiusConvention.HALF_WIDTH)
    assert a.half_width == b.half_width == 5.0 and a.support == 10.0
    d = np.array([0.0, 5.0, 9.999, 10.0])
    for t in Taper:
        w = weights(t, d, 5.0)
        assert w[0] == 1.0 and w[3] == 0.0 and w[2] > 0.0


def test_local_obs_drop_zero_weights():
    obs_xy = np.array([[0.0, 0.0], [3.0, 0.0], [4.0, 0.0], [10.0, 0.0]])
    geo = Geometry(Metric.CARTESIAN, obs_xy)
    off, idx, wt = Localization(half_width=2.0).local_obs(geo, np.array([[0.0, 0.0], [100.0, 0.0]]))
    assert off.tolist() == [0, 2, 2] and idx.tolist() == [0, 1] and wt[0] == 1.0


def test_sphere_distances_are_great_circle_km():
    geo = Geometry(Metric.SPHERE, np.array([[0.0, 0.0], [90.0, 0.0], [0.0, 1.0]]))
    nb = geo.neighbours(np.array([[0.0, 0.0]]), 200.0)
    assert nb.idx.tolist() == [0, 2]
    assert np.isclose(nb.dist[1], 6371.0 * np.pi / 180.0, rtol=1e-12)


def test_inflation_variants():
    rng = np.random.default_rng(1)
    Xf = rng.standard_normal((5, 20))
    Xa0 = Xf.mean(axis=1, keepdims=True) + 0.5 * (Xf - Xf.mean(axis=1, keepdims=True))
    Xa = Xa0.copy()
    inflate_posterior(Xa, Xf, Inflation(rtps=1.0))  # full relaxation to prior spread
    assert np.allclose(Xa.std(axis=1), Xf.std(axis=1))
    Xa = Xa0.copy()
    inflate_posterior(Xa, Xf, Inflation(rtpp=1.0))  # full relaxation to prior perturbations
    assert np.allclose(Xa - Xa.mean(axis=1, keepdims=True), Xf - Xf.mean(axis=1, keepdims=True))
    Xa = Xa0.copy()
    inflate_posterior(Xa, Xf, Inflation(posterior=2.0))
    assert np.allclose(Xa, Xf) and np.allclose(Xa.mean(axis=1), Xa0.mean(axis=1))
    assert Inflation(prior=2.0).forgetting_factor == 0.25


def test_operators_selection_and_bilinear_partial_sums():
    rng = np.random.default_rng(0)
    lon = np.arange(0.0, 360.0, 10.0)
    lat = np.arange(-80.0, 81.0, 10.0)
    rows = np.arange(lat.size * lon.size).reshape(lat.size, lon.size)
    LON, LAT = np.meshgrid(lon, lat)
    f = 2.0 + 0.01 * LAT + 0.3 * LAT / 80.0  # linear in lat: bilinear interpolation is exact
    X = np.asfortranarray(np.stack([f.ravel() + k for k in range(3)], axis=1))
    olon = rng.uniform(0, 360, 50)
    olat = rng.uniform(-80, 80, 50)
    H = LinearObsOperator.bilinear(lon, lat, rows, olon, olat, rows.size)
    HX = H.apply(X, 0, SerialComm())
    expect = 2.0 + 0.01 * olat + 0.3 * olat / 80.0
    assert np.allclose(HX[:, 0], expect) and np.allclose(HX[:, 2], expect + 2)
    # Split across two "ranks": the partial products sum to the whole.
    half = X.shape[0] // 2
    parts = H.apply_local(X[:half], 0) + H.apply_local(X[half:], half)
    assert np.allclose(parts, HX)
    # Masked corners are dropped and the weights renormalized.
    masked = rows.copy()
    masked[:, 1] = -1
    Hm = LinearObsOperator.bilinear(lon, lat, masked, np.array([5.0]), np.array([5.0]), rows.size)
    assert np.isclose(Hm.H.sum(), 1.0) and Hm.H.nnz == 2
    sel = LinearObsOperator.selection(np.array([3, 0]), 4)
    assert np.array_equal(sel.apply(np.arange(8.0).reshape(4, 2), 0, SerialComm()), [[6, 7], [0, 1]])


def test_config_localization_validation():
    from enkflow.config import AnalysisConfig, validate
    from enkflow.errors import ConfigError

    with pytest.raises(ConfigError, match="analysis.localization.radius"):
        validate(AnalysisConfig, {"method": "letkf", "localization": {"radius": -1}}, prefix="analysis")
    with pytest.raises(ConfigError, match="unknown key.*analysis.bogus"):
        validate(AnalysisConfig, {"bogus": 1}, prefix="analysis")
    cfg = validate(AnalysisConfig, {"method": "lestkf", "localization": {"radius": 10, "convention": "cutoff"}})
    assert Localization.from_config(cfg.localization).half_width == 5.0
