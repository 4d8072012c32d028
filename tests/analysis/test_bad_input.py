"""Bad input: a typed error naming the item, raised before anything is written."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.analysis import ETKF, EnKF, LETKF, Inflation, LocalDomains, Localization, ObsSet
from enkflow.config import Metric
from enkflow.errors import InputError
from enkflow.obs import LinearObsOperator


def local(X, HX, obs, coords, **kw):
    """In-place LETKF: on error X must be untouched."""
    before = X.copy()
    with pytest.raises(InputError) as exc:
        LETKF(localization=kw.pop("loc", Localization(half_width=3.0))).analyze(
            X, HX, obs, domains=kw.pop("domains", LocalDomains.per_row(coords)), out=X
        )
    assert np.array_equal(X, before, equal_nan=True)
    return exc.value


def test_nan_or_inf_in_ensemble(problem):
    X, HX, obs, coords, _ = problem
    X[7, 3] = np.nan
    err = local(X, HX, obs, coords)
    assert err.item == "ensemble" and err.index == (7, 3) and "(row, member) = (7, 3)" in str(err)
    X[7, 3] = 0.0
    HX[2, 1] = np.inf
    err = local(X, HX, obs, coords)
    assert err.item == "HX" and err.index == (2, 1)
    with pytest.raises(InputError, match="ensemble"):
        ETKF().analyze(np.full((3, 4), np.inf), np.zeros((1, 4)), ObsSet([1.0], [1.0], [[0.0]]))


def test_bad_observations():
    with pytest.raises(InputError, match=r"obs.values holds NaN or Inf at index \(1,\)"):
        ObsSet([1.0, np.nan], [1.0, 1.0], [[0.0], [1.0]])
    with pytest.raises(InputError, match=r"obs.error_var must be > 0; observation 1 has 0.0"):
        ObsSet([1.0, 2.0], [1.0, 0.0], [[0.0], [1.0]])
    with pytest.raises(InputError, match="obs.error_var must be > 0"):
        ObsSet([1.0], [-2.0], [[0.0]])
    with pytest.raises(InputError, match="obs.coords has 1 rows, expected 2"):
        ObsSet([1.0, 2.0], [1.0, 1.0], [[0.0]])


def test_mismatched_shapes(problem):
    X, HX, obs, coords, _ = problem
    err = local(X, HX[:-1], obs, coords)
    assert err.item == "HX" and "expected (n_obs, n_members)" in str(err)
    err = local(X, HX[:, :-1], obs, coords)
    assert err.item == "HX"
    bad_dom = LocalDomains.per_row(np.vstack([coords, coords[:1]]))
    err = local(X, HX, obs, coords, domains=bad_dom)
    assert err.item == "domains"
    err = local(X, HX, obs, coords, domains=LocalDomains.per_row(coords[:, :1]))
    assert err.item == "domain coordinates"


def test_radius_must_be_positive():
    for r in (0.0, -1.0, np.nan):
        with pytest.raises(InputError, match="localization") as exc:
            Localization(half_width=r)
        assert exc.value.item == "localization.radius"
    with pytest.raises(InputError, match="period"):
        Localization(half_width=1.0, metric=Metric.PERIODIC)


def test_fewer_than_two_members(problem):
    X, HX, obs, coords, _ = problem
    X1 = np.asfortranarray(X[:, :1])
    err = local(X1, HX[:, :1], obs, coords)
    assert "at least 2" in str(err)
    with pytest.raises(InputError, match="at least 2"):
        EnKF().analyze(X1, HX[:, :1], obs)


def test_observations_outside_the_domain(problem):
    X, HX, obs, coords, _ = problem
    with pytest.raises(InputError, match="observation 1 refers to state row 99, outside the domain"):
        LinearObsOperator.selection(np.array([0, 99]), 50)
    # On the sphere: an observation at latitude 95.
    lonlat = np.array([[0.0, 10.0], [20.0, 95.0]])
    sph = ObsSet([1.0, 2.0], [1.0, 1.0], lonlat)
    Xs = np.asfortranarray(np.random.default_rng(0).standard_normal((3, 5)))
    err = local(Xs, Xs[:2], sph, np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]),
                loc=Localization(half_width=500.0, metric=Metric.SPHERE))
    assert err.item == "obs.coords" and err.index == 1
    # On a ring of 40 points: an observation at 41.
    ring = ObsSet([1.0], [1.0], [[41.0]])
    Xr = np.asfortranarray(np.random.default_rng(0).standard_normal((40, 5)))
    err = local(Xr, Xr[:1], ring, np.arange(40.0), loc=Localization(half_width=2.0, metric=Metric.PERIODIC, period=40.0))
    assert "outside the domain [0, 40.0)" in str(err)
    # Bilinear interpolation beyond the grid's latitudes.
    lon = np.arange(0.0, 360.0, 30.0)
    lat = np.arange(-60.0, 61.0, 30.0)
    rows = np.arange(lat.size * lon.size).reshape(lat.size, lon.size)
    with pytest.raises(InputError, match="outside the grid's latitudes"):
        LinearObsOperator.bilinear(lon, lat, rows, np.array([10.0]), np.array([75.0]), rows.size)


def test_inflation_parameters_are_checked():
    with pytest.raises(InputError, match="inflation.prior"):
        Inflation(prior=0.0)
    with pytest.raises(InputError, match="inflation.rtps"):
        Inflation(rtps=1.5)
