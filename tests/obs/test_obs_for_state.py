"""Observation files against the state and the metric (enkflow.obs.obsfile.load_for_state).

lon/lat are needed only by the sphere metric: a Cartesian analysis places each
observation at its state row, so a file may leave them out or hold grid indices
there (a grid of more than 90 rows storing y as "lat").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.config import AnalysisConfig, Metric, validate
from enkflow.errors import ConfigError, FileFormatError
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.obsfile import ObsSettings, load_for_state, read_obs_file
from enkflow.state import StateLayout
from enkflow.state.config import StateConfig

NY, NX = 120, 3  # more than 90 rows: y indices are no latitudes
IDX = np.array([5, 200, 300, 359])


def _grid(path: Path, *, lonlat_coords: bool = False, lat_max: float = 89.0, seed: int = 0) -> Path:
    """A restart with h(y, x); grid-index coordinates, or CF lon/lat ones reaching ``lat_max``."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", NY)
        ds.createDimension("x", NX)
        ds.createVariable("h", "f8", ("y", "x"))[:] = np.random.default_rng(seed).normal(size=(NY, NX))
        if lonlat_coords:
            lat = ds.createVariable("y", "f8", ("y",))
            lat.setncatts({"standard_name": "latitude", "units": "degrees_north"})
            lat[:] = np.linspace(-89.0, lat_max, NY)
            lon = ds.createVariable("x", "f8", ("x",))
            lon.setncatts({"standard_name": "longitude", "units": "degrees_east"})
            lon[:] = [0.0, 120.0, 240.0]
    return path


def _obs(path: Path, *, skip: tuple[str, ...] = (), **override: Any) -> Path:
    """An observation file of 4 observations at rows IDX; lon/lat hold the grid indices x, y."""
    data: dict[str, Any] = {
        "value": np.zeros(IDX.size), "error_std": np.ones(IDX.size),
        "lon": (IDX % NX).astype(float), "lat": (IDX // NX).astype(float), "state_index": IDX,
    }
    data.update(override)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", IDX.size)
        for name, values in data.items():
            if name not in skip:
                ds.createVariable(name, np.asarray(values).dtype, ("obs",))[:] = values
    return path


def _layout(path: Path) -> StateLayout:
    return StateLayout.from_file(path, ["h"])


def test_cartesian_ignores_lat_beyond_90_and_missing_lon_lat(tmp_path: Path) -> None:
    layout = _layout(_grid(tmp_path / "m.nc"))
    assert layout.coord_kind == "index"
    of = load_for_state(_obs(tmp_path / "o.nc"), layout, Metric.CARTESIAN, cycle=4)
    assert (of.obs.coords.max(axis=0) >= [2, 119]).all()
    # The observations sit at their state rows' coordinates, (x, y) here.
    np.testing.assert_array_equal(of.obs.coords, np.column_stack([IDX % NX, IDX // NX]))
    np.testing.assert_array_equal(of.state_index, IDX)
    for metric in (Metric.CARTESIAN, None):  # None: a global analysis
        of = load_for_state(_obs(tmp_path / "nolonlat.nc", skip=("lon", "lat")), layout, metric)
        np.testing.assert_array_equal(of.state_index, IDX)
    assert read_obs_file(tmp_path / "nolonlat.nc", lonlat=False).obs.coords.shape == (4, 0)


def test_builtin_analysis_with_cartesian_metric_takes_lat_beyond_90(tmp_path: Path) -> None:
    from enkflow.experiment.analysis_step import analyse_files

    paths = [_grid(tmp_path / f"m{k}.nc", seed=k) for k in range(1, 5)]
    cfg = validate(AnalysisConfig, {"method": "letkf", "localization": {"radius": 5.0, "metric": "cartesian"}})
    for obs in (_obs(tmp_path / "o.nc"), _obs(tmp_path / "nolonlat.nc", skip=("lon", "lat"))):
        diag = analyse_files(paths, obs, StateConfig(variables=["h"]), cfg, cycle=1)
        assert diag["n_obs"] == IDX.size and diag["oma_rms"] < diag["omb_rms"]


def test_sphere_index_reads_no_coordinates_nearest_needs_lon_lat_in_range(tmp_path: Path) -> None:
    layout = _layout(_grid(tmp_path / "m.nc", lonlat_coords=True))
    assert layout.coord_kind == "lonlat"
    lat = np.array([0.0, 10.0, 20.0, 30.0])
    of = load_for_state(_obs(tmp_path / "ok.nc", lat=lat), layout, Metric.SPHERE)
    np.testing.assert_array_equal(of.obs.coords, layout.coords[IDX])
    # interpolation "index": the observation sits at its state row; lon/lat are neither needed nor read.
    for p in (_obs(tmp_path / "nolat.nc", skip=("lat",)), _obs(tmp_path / "o.nc", lat=[0.0, 100.0, 0.0, 0.0])):
        of = load_for_state(p, layout, Metric.SPHERE, cycle=3)
        np.testing.assert_array_equal(of.obs.coords, layout.coords[IDX])
    nearest = ObsSettings(ObsSettingsConfig(interpolation="nearest"))
    with pytest.raises(FileFormatError, match=r"variable missing.*\(observation file of cycle 3\)") as ei:
        load_for_state(_obs(tmp_path / "nolat.nc", skip=("lat",)), layout, Metric.SPHERE, cycle=3, settings=nearest)
    assert ei.value.variable == "lat" and ei.value.path == str(tmp_path / "nolat.nc")
    with pytest.raises(FileFormatError, match=r"must lie in \[-90, 90\] degrees; index 1 has 100.0") as ei:
        load_for_state(_obs(tmp_path / "o.nc", lat=[0.0, 100.0, 0.0, 0.0]), layout, Metric.SPHERE, cycle=3,
                       settings=nearest)
    assert ei.value.variable == "lat" and "cycle 3" in str(ei.value)
    with pytest.raises(FileFormatError, match=r"must lie in \[-180, 360\] degrees; index 2 has 400.0") as ei:
        load_for_state(_obs(tmp_path / "o.nc", lat=lat, lon=[0.0, 0.0, 400.0, 0.0]), layout, Metric.SPHERE,
                       settings=nearest)
    assert ei.value.variable == "lon"


def test_sphere_metric_against_the_state_coordinates(tmp_path: Path) -> None:
    obs = _obs(tmp_path / "o.nc", lat=np.zeros(IDX.size))
    index_state = _layout(_grid(tmp_path / "index.nc"))
    with pytest.raises(ConfigError, match="sphere metric needs longitude/latitude coordinates") as ei:
        load_for_state(obs, index_state, Metric.SPHERE)
    assert ei.value.key == "analysis.localization.metric" and "index.nc" in str(ei.value)
    # The state claims degrees but its "latitudes" run to 150: observation 3 sits at row 359 (y = 119).
    bad = _layout(_grid(tmp_path / "bad.nc", lonlat_coords=True, lat_max=150.0))
    with pytest.raises(FileFormatError, match=r"\[-90, 90\] degrees for the sphere metric; observation 2") as ei:
        load_for_state(obs, bad, Metric.SPHERE, cycle=2)
    assert ei.value.path == str(tmp_path / "bad.nc") and ei.value.variable == "y" and "cycle 2" in str(ei.value)


@pytest.mark.parametrize("variable, data, message", [
    ("value", [0.0, 0.0, np.nan, 0.0], "holds NaN or Inf at index 2"),
    ("error_std", [1.0, 0.0, 1.0, 1.0], "must be > 0; index 1 has 0.0"),
    ("state_index", np.array([5, 200, 360, 359]), "must be < n_state = 360; index 2 has 360"),
])
def test_errors_name_file_variable_cycle_and_index(tmp_path: Path, variable: str, data: Any, message: str) -> None:
    layout = _layout(_grid(tmp_path / "m.nc"))
    p = _obs(tmp_path / "bad.nc", **{variable: data})
    with pytest.raises(FileFormatError, match=message) as ei:
        load_for_state(p, layout, Metric.CARTESIAN, cycle=7)
    assert ei.value.path == str(p) and ei.value.variable == variable
    assert str(ei.value).endswith("(observation file of cycle 7)")
