"""Vertical localization in the local filters (issue 14): domains per point and level, the weight
the product of a horizontal and a vertical taper; against a direct per-row LETKF."""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.analysis import LETKF, LocalDomains, Localization
from enkflow.analysis.taper import gaspari_cohn
from enkflow.analysis.transforms import letkf_weights
from enkflow.config import AnalysisConfig, LocalizationConfig, Metric, validate
from enkflow.errors import ConfigError, FileFormatError
from enkflow.experiment.cycling import ArrayStore
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.obs.vertical import localization_coords, row_vertical
from enkflow.parallel import SerialComm
from enkflow.state import StateLayout

NL, NY, NX, N = 5, 6, 8, 10


def _state(path: Path, *, pressure: bool = False) -> StateLayout:
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in (("lev", NL), ("y", NY), ("x", NX)):
            ds.createDimension(d, n)
        ds.createVariable("t", "f8", ("lev", "y", "x"))[:] = 0.0
        if pressure:
            ds.createVariable("p", "f8", ("lev",))[:] = [1000.0, 850.0, 700.0, 500.0, 300.0]
    return StateLayout.from_file(path, ["t"])


def _obs(path: Path, idx: np.ndarray, y: np.ndarray, level: np.ndarray | None = None) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", idx.size)
        ds.createVariable("value", "f8", ("obs",))[:] = y
        ds.createVariable("error_std", "f8", ("obs",))[:] = 0.5
        ds.createVariable("state_index", "i8", ("obs",))[:] = idx
        if level is not None:
            ds.createVariable("level", "f8", ("obs",))[:] = level
    return path


def test_vertical_localization_matches_a_direct_per_row_letkf(tmp_path: Path) -> None:
    layout = _state(tmp_path / "t.nc")
    np.testing.assert_array_equal(row_vertical(layout, "lev"), np.repeat(np.arange(NL), NY * NX))
    rng = np.random.default_rng(0)
    X = np.asfortranarray(rng.normal(size=(layout.n_rows, N)))
    idx = np.sort(rng.choice(layout.n_rows, 40, replace=False))
    y = rng.normal(size=idx.size)
    p = _obs(tmp_path / "o.nc", idx, y)
    loc = LocalizationConfig(radius=2.0, metric=Metric.CARTESIAN, vertical_radius=0.75, vertical_coordinate="lev")
    settings = ObsSettings(localization=loc)
    of = load_for_state(p, layout, loc.metric, settings=settings)
    np.testing.assert_array_equal(of.obs.vcoord, idx // (NY * NX))  # the observed rows' levels
    rc = localization_coords(layout, loc)
    domains = LocalDomains.by_location(rc)
    assert domains.n_domains == layout.n_rows  # one domain per (point, level)
    flt = LETKF(localization=Localization.from_config(loc))
    Xa, _ = analyse(AnalysisStep(flt, LocalGeometry(domains)), ArrayStore(X.copy(order="F"), comm=SerialComm()),
                    FileObservations(of, layout.n_rows), 1)
    # Directly: weight = GC(horizontal distance / 2) * GC(|level difference| / 0.75), per row.
    HX = X[idx]
    Yp, dy = HX - HX.mean(axis=1, keepdims=True), y - HX.mean(axis=1)
    zo, xo = of.obs.vcoord, of.obs.coords
    for r in rng.choice(layout.n_rows, 60, replace=False):
        w = gaspari_cohn(np.linalg.norm(xo - layout.coords[r], axis=1) / 2.0) * gaspari_cohn(np.abs(zo - rc[r, -1]) / 0.75)
        o = np.flatnonzero(w > 0)
        xf = X[r]
        if o.size == 0:
            np.testing.assert_array_equal(Xa[r], xf)
            continue
        wm, W = letkf_weights(dy[o], Yp[o], w[o] / 0.25, 1.0)
        want = xf.mean() + (xf - xf.mean()) @ (wm[:, None] + W)
        np.testing.assert_allclose(Xa[r], want, rtol=0, atol=1e-10)
    # Without vertical localization every level of a point gets the same weights: the rows differ.
    flat = Localization.from_config(LocalizationConfig(radius=2.0, metric=Metric.CARTESIAN))
    Xb, _ = analyse(AnalysisStep(LETKF(localization=flat), LocalGeometry(LocalDomains.by_location(layout.coords))),
                    ArrayStore(X.copy(order="F"), comm=SerialComm()), FileObservations(of, layout.n_rows), 1)
    assert not np.allclose(Xa, Xb)


def test_vertical_coordinate_variable_and_missing_pieces(tmp_path: Path) -> None:
    layout = _state(tmp_path / "t.nc", pressure=True)
    np.testing.assert_array_equal(row_vertical(layout, "p")[:: NY * NX], [1000.0, 850.0, 700.0, 500.0, 300.0])
    idx = np.array([3, 60, 100])
    loc = LocalizationConfig(radius=2.0, metric=Metric.CARTESIAN, vertical_radius=100.0, vertical_coordinate="p")
    of = load_for_state(_obs(tmp_path / "o.nc", idx, np.zeros(3), level=np.array([990.0, 640.0, 320.0])), layout,
                        loc.metric, settings=ObsSettings(localization=loc))
    np.testing.assert_array_equal(of.obs.vcoord, [990.0, 640.0, 320.0])
    with pytest.raises(FileFormatError, match=r"observation 1 at level 200.0 is outside .* \[300, 1000\]") as ei:
        load_for_state(_obs(tmp_path / "b.nc", idx, np.zeros(3), level=np.array([990.0, 200.0, 320.0])), layout,
                       loc.metric, cycle=2, settings=ObsSettings(localization=loc))
    assert ei.value.variable == "level" and "cycle 2" in str(ei.value)
    missing = LocalizationConfig(radius=2.0, metric=Metric.CARTESIAN, vertical_radius=1.0, vertical_coordinate="height")
    with pytest.raises(ConfigError, match=r"vertical coordinate 'height' is neither a dimension .* nor a variable of") as ei:
        load_for_state(tmp_path / "o.nc", layout, loc.metric, settings=ObsSettings(localization=missing))
    assert ei.value.key == "analysis.localization.vertical_coordinate"
    with pytest.raises(ConfigError, match="vertical_radius needs vertical_coordinate") as ei:
        validate(AnalysisConfig, {"localization": {"radius": 2.0, "vertical_radius": 1.0}}, prefix="analysis")
    # A filter given domains without a vertical column, or observations without a vertical coordinate.
    from enkflow.analysis import ObsSet
    from enkflow.errors import InputError

    flt = LETKF(localization=Localization.from_config(loc))
    X = np.asfortranarray(np.random.default_rng(1).normal(size=(layout.n_rows, N)))
    obs = ObsSet(np.zeros(3), np.ones(3), layout.coords[idx])
    with pytest.raises(InputError, match="vertical coordinate"):
        flt.analyze(X, X[idx], obs, domains=LocalDomains.by_location(localization_coords(layout, loc)))


def test_analyse_files_with_vertical_localization_balanced_or_not(tmp_path: Path) -> None:
    """The built-in analysis of member files: domains per (point, level) in both decompositions."""
    from enkflow.experiment.analysis_step import analyse_files
    from enkflow.state.config import StateConfig

    runs = {}
    for balance in (False, True):
        paths = []
        for m in range(N):
            p = tmp_path / f"{balance}_m{m}.nc"
            _state(p)
            with netCDF4.Dataset(p, "a") as ds:
                ds["t"][:] = np.random.default_rng(m).normal(size=(NL, NY, NX))
            paths.append(p)
        idx = np.arange(0, NL * NY * NX, 7)
        obs = _obs(tmp_path / "o.nc", idx, np.random.default_rng(9).normal(size=idx.size))
        cfg = validate(AnalysisConfig, {"method": "letkf", "localization": {
            "radius": 2.0, "metric": "cartesian", "vertical_radius": 1.0, "vertical_coordinate": "lev"}})
        diag = analyse_files(paths, obs, StateConfig(variables=["t"]), cfg, cycle=1, balance=balance)
        assert diag["oma_rms"] < diag["omb_rms"]
        runs[balance] = np.stack([_read(p) for p in paths])
    np.testing.assert_allclose(runs[True], runs[False], rtol=0, atol=1e-12)


def _read(p: Path) -> np.ndarray:
    with netCDF4.Dataset(p) as ds:
        return np.asarray(ds["t"][:])
