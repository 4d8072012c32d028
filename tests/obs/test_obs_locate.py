"""Observations located by their own coordinates (issue 14, acceptance 5), kinds, time slots.

On grid points, observations given only by lon/lat (or x/y, or x on the ring) give the same
analysis as the same observations given by ``state_index`` (to 1e-12; nearest and bilinear
alike); off the grid, bilinear H is checked against a direct computation.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.analysis import LETKF, LocalDomains, Localization
from enkflow.config import LocalizationConfig, Metric
from enkflow.errors import ConfigError, FileFormatError
from enkflow.experiment.cycling import ArrayStore
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.parallel import SerialComm
from enkflow.state import StateLayout

N = 8
LON = np.arange(0.0, 360.0, 10.0)  # a global regular grid: 36 x 18
LAT = np.arange(-85.0, 90.0, 10.0)


def _lonlat_grid(path: Path) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("lat", LAT.size)
        ds.createDimension("lon", LON.size)
        v = ds.createVariable("lat", "f8", ("lat",))
        v.setncatts({"standard_name": "latitude", "units": "degrees_north"})
        v[:] = LAT
        v = ds.createVariable("lon", "f8", ("lon",))
        v.setncatts({"standard_name": "longitude", "units": "degrees_east"})
        v[:] = LON
        ds.createVariable("h", "f8", ("lat", "lon"))[:] = 0.0
    return path


def _index_grid(path: Path, shape: tuple[int, ...]) -> Path:
    dims = ("y", "x")[-len(shape):]
    with netCDF4.Dataset(path, "w") as ds:
        for d, n in zip(dims, shape):
            ds.createDimension(d, n)
        ds.createVariable("h", "f8", dims)[:] = 0.0
    return path


def _ensemble(n_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.asfortranarray(rng.normal(size=(n_rows, N)))
    return X, rng.normal(size=n_rows)


def _write(path: Path, values: np.ndarray, coords: np.ndarray | None, names: tuple[str, ...],
           state_index: np.ndarray | None, **extra: np.ndarray) -> Path:
    n = values.size
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", n)
        ds.createVariable("value", "f8", ("obs",))[:] = values
        ds.createVariable("error_std", "f8", ("obs",))[:] = np.full(n, 0.5)
        if state_index is not None:
            ds.createVariable("state_index", "i8", ("obs",))[:] = state_index
        if coords is not None:
            for k, name in enumerate(names):
                ds.createVariable(name, "f8", ("obs",))[:] = coords[:, k]
        for name, a in extra.items():
            ds.createVariable(name, np.asarray(a).dtype, ("obs",))[:] = a
    return path


def _analysis(path: Path, layout: StateLayout, loc: LocalizationConfig, interpolation: str, X: np.ndarray,
              **cfg) -> tuple[np.ndarray, dict]:
    settings = ObsSettings(ObsSettingsConfig(interpolation=interpolation, **cfg), loc)
    of = load_for_state(path, layout, loc.metric, settings=settings)
    obs = FileObservations(of, layout.n_rows, settings=settings)
    flt = LETKF(localization=Localization.from_config(loc))
    store = ArrayStore(np.array(X, order="F", copy=True), comm=SerialComm())
    Xa, diag = analyse(AnalysisStep(flt, LocalGeometry(LocalDomains.by_location(layout.coords))), store, obs, 1)
    return Xa, diag.as_dict()


CASES = {
    "sphere": (lambda p: _lonlat_grid(p), LocalizationConfig(radius=1500.0, metric=Metric.SPHERE), ("lon", "lat")),
    "cartesian": (lambda p: _index_grid(p, (12, 20)), LocalizationConfig(radius=3.0, metric=Metric.CARTESIAN), ("x", "y")),
    "periodic": (lambda p: _index_grid(p, (60,)),
                 LocalizationConfig(radius=4.0, metric=Metric.PERIODIC, period=60.0), ("x",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_observations_by_coordinates_on_grid_points_give_the_state_index_analysis(tmp_path: Path, case: str) -> None:
    make, loc, names = CASES[case]
    layout = StateLayout.from_file(make(tmp_path / "grid.nc"), ["h"])
    X, truth = _ensemble(layout.n_rows)
    rng = np.random.default_rng(1)
    idx = np.sort(rng.choice(layout.n_rows, size=layout.n_rows // 4, replace=False))
    y = truth[idx] + 0.5 * rng.normal(size=idx.size)
    by_index = _write(tmp_path / "index.nc", y, None, names, idx)
    by_coords = _write(tmp_path / "coords.nc", y, layout.coords[idx], names, None)
    ref, dref = _analysis(by_index, layout, loc, "index", X)
    assert dref["oma_rms"] < dref["omb_rms"]
    for interp in ("nearest", "bilinear"):
        got, d = _analysis(by_coords, layout, loc, interp, X)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
        assert d["n_obs"] == idx.size and abs(d["omb_rms"] - dref["omb_rms"]) <= 1e-12
    # The file's state_index is not what locates observations by coordinates: a file with both is read
    # by its coordinates (here they agree), and a file with coordinates only cannot be read by index.
    with pytest.raises(FileFormatError, match="interpolation 'index' locates observations by state_index") as ei:
        load_for_state(by_coords, layout, loc.metric)
    assert ei.value.variable == "state_index"


def _bilinear_by_hand(field: np.ndarray, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """The textbook formula on the global grid above: field (lat, lon), periodic in longitude."""
    out = np.empty(lon.size)
    for k, (a, b) in enumerate(zip(lon, lat)):
        i0 = int(np.floor((a % 360.0) / 10.0)) % LON.size
        i1 = (i0 + 1) % LON.size
        fx = ((a % 360.0) - LON[i0]) / 10.0
        j0 = min(int(np.floor((b - LAT[0]) / 10.0)), LAT.size - 2)
        fy = (b - LAT[j0]) / 10.0
        out[k] = ((1 - fx) * (1 - fy) * field[j0, i0] + fx * (1 - fy) * field[j0, i1]
                  + (1 - fx) * fy * field[j0 + 1, i0] + fx * fy * field[j0 + 1, i1])
    return out


def test_off_grid_bilinear_against_a_direct_computation(tmp_path: Path) -> None:
    layout = StateLayout.from_file(_lonlat_grid(tmp_path / "grid.nc"), ["h"])
    rng = np.random.default_rng(3)
    n = 200
    lon = np.r_[rng.uniform(-180.0, 360.0, n - 3), 355.0, -2.5, 123.4]  # across the date line, negative longitudes
    lat = np.r_[rng.uniform(LAT[0], LAT[-1], n - 3), 84.9, -85.0, 0.0]
    p = _write(tmp_path / "o.nc", np.zeros(n), np.column_stack([lon, lat]), ("lon", "lat"), None)
    settings = ObsSettings(ObsSettingsConfig(interpolation="bilinear"))
    of = load_for_state(p, layout, Metric.SPHERE, settings=settings)
    np.testing.assert_array_equal(of.obs.coords, np.column_stack([lon, lat]))  # localized where they are
    obs = FileObservations(of, layout.n_rows)
    x = rng.normal(size=layout.n_rows)
    got = obs.apply_analysis(1, x[:, None], 0, SerialComm())[:, 0]
    np.testing.assert_allclose(got, _bilinear_by_hand(x.reshape(LAT.size, LON.size), lon, lat), rtol=0, atol=1e-12)
    # Nearest: the grid point nearest on the sphere.
    near = FileObservations(load_for_state(p, layout, Metric.SPHERE,
                                           settings=ObsSettings(ObsSettingsConfig(interpolation="nearest"))),
                            layout.n_rows)
    from enkflow.analysis.geometry import Geometry

    d = Geometry(Metric.SPHERE, layout.coords).distances
    for k in range(0, n, 17):
        best = np.min(d(layout.coords, np.repeat([[lon[k], lat[k]]], layout.n_rows, axis=0)))
        chosen = int(near.file.state_index[k])
        assert d(layout.coords[[chosen]], np.array([[lon[k], lat[k]]]))[0] <= best + 1e-9


def test_off_grid_bilinear_on_a_cartesian_grid_and_masked_corners(tmp_path: Path) -> None:
    layout = StateLayout.from_file(_index_grid(tmp_path / "grid.nc", (12, 20)), ["h"])
    rng = np.random.default_rng(4)
    xy = np.column_stack([rng.uniform(0, 19, 50), rng.uniform(0, 11, 50)])
    p = _write(tmp_path / "o.nc", np.zeros(50), xy, ("x", "y"), None)
    obs = FileObservations(load_for_state(p, layout, Metric.CARTESIAN,
                                          settings=ObsSettings(ObsSettingsConfig(interpolation="bilinear"))),
                           layout.n_rows)
    f = rng.normal(size=(12, 20))
    i0, j0 = np.floor(xy[:, 0]).astype(int), np.floor(xy[:, 1]).astype(int)
    fx, fy = xy[:, 0] - i0, xy[:, 1] - j0
    want = ((1 - fx) * (1 - fy) * f[j0, i0] + fx * (1 - fy) * f[j0, i0 + 1] + (1 - fx) * fy * f[j0 + 1, i0]
            + fx * fy * f[j0 + 1, i0 + 1])
    np.testing.assert_allclose(obs.apply_analysis(1, f.ravel()[:, None], 0, SerialComm())[:, 0], want, rtol=0, atol=1e-12)
    # Outside the grid: an error naming the file, the coordinate and the observation.
    bad = _write(tmp_path / "bad.nc", np.zeros(2), np.array([[3.0, 4.0], [19.5, 2.0]]), ("x", "y"), None)
    with pytest.raises(FileFormatError, match=r"observation 1 at \(19.5, 2\) is outside the domain.*x must lie in \[0, 19\]"):
        load_for_state(bad, layout, Metric.CARTESIAN, cycle=2, settings=ObsSettings(ObsSettingsConfig(interpolation="bilinear")))


def test_kinds_scale_errors_set_radii_and_must_be_known(tmp_path: Path) -> None:
    layout = StateLayout.from_file(_index_grid(tmp_path / "grid.nc", (60,)), ["h"])
    idx = np.arange(0, 60, 3)
    kinds = (idx % 2).astype(np.int32)
    p = _write(tmp_path / "o.nc", np.zeros(idx.size), None, ("x",), idx, kind=kinds)
    with netCDF4.Dataset(p, "a") as ds:
        ds["kind"].setncatts({"flag_values": np.array([0, 1], np.int32), "flag_meanings": "buoy ship"})
    loc = LocalizationConfig(radius=4.0, metric=Metric.PERIODIC, period=60.0)
    cfg = ObsSettingsConfig(kinds={"buoy": {"radius": 8.0}, "ship": {"code": 1, "error_factor": 2.0, "qc_sigma": 3.0}})
    of = load_for_state(p, layout, Metric.PERIODIC, settings=ObsSettings(cfg, loc))
    np.testing.assert_array_equal(of.obs.error_var, np.where(kinds == 1, 1.0, 0.25))  # (2 * 0.5)^2
    np.testing.assert_array_equal(of.obs.half_width, np.where(kinds == 0, 8.0, 4.0))
    np.testing.assert_array_equal(of.qc_sigma, np.where(kinds == 1, 3.0, np.inf))
    assert of.kind_names == {0: "buoy", 1: "ship"}
    # The per-kind radius reaches the weights: a buoy 12 points away still counts, a ship does not.
    w = Localization.from_config(loc).for_obs(of.obs)
    from enkflow.analysis.geometry import Geometry

    o, i, wt = w.local_obs(Geometry(Metric.PERIODIC, of.obs.coords, 60.0), np.array([[30.0]]))
    assert 42 in of.state_index[i] and 39 not in of.state_index[i]
    with pytest.raises(FileFormatError, match=r"kind 1 \('ship' in its flag_meanings\) of observation 1 is not a configured kind"):
        load_for_state(p, layout, Metric.PERIODIC, cycle=5, settings=ObsSettings(
            ObsSettingsConfig(kinds={"buoy": {}}), loc))
    # Two variables, nearest: each kind must say which one it observes.
    with netCDF4.Dataset(tmp_path / "two.nc", "w") as ds:
        ds.createDimension("x", 60)
        ds.createVariable("h", "f8", ("x",))[:] = 0.0
        ds.createVariable("u", "f8", ("x",))[:] = 0.0
    two = StateLayout.from_file(tmp_path / "two.nc", ["h", "u"])
    q = _write(tmp_path / "q.nc", np.zeros(3), np.array([[1.0], [2.0], [3.0]]), ("x",), None, kind=np.array([0, 1, 1], np.int32))
    with pytest.raises(ConfigError, match="needs the variable each observation kind observes") as ei:
        load_for_state(q, two, Metric.PERIODIC, settings=ObsSettings(ObsSettingsConfig(interpolation="nearest"), loc))
    assert ei.value.key == "observations.kinds"
    ok = ObsSettingsConfig(interpolation="nearest", kinds={"a": {"code": 0, "variable": "h"}, "b": {"code": 1, "variable": "u"}})
    of = load_for_state(q, two, Metric.PERIODIC, settings=ObsSettings(ok, loc))
    np.testing.assert_array_equal(of.state_index, [1, 62, 63])


def test_operator_output_per_time_slot_is_taken_at_each_observations_time(tmp_path: Path) -> None:
    layout = StateLayout.from_file(_index_grid(tmp_path / "grid.nc", (10,)), ["h"])
    times = np.array([-6.0, -4.4, -3.0, -0.2, 0.0])
    p = _write(tmp_path / "o.nc", np.zeros(5), None, ("x",), np.arange(5), time=times)
    of = load_for_state(p, layout, None, settings=ObsSettings(window=(-6.0, 0.0)))
    slots = np.array([-6.0, -3.0, 0.0])
    hx_files = []
    for m in range(N):
        f = tmp_path / f"hx_{m}.nc"
        with netCDF4.Dataset(f, "w") as ds:
            ds.createDimension("slot", 3)
            ds.createDimension("obs", 5)
            ds.createVariable("slot_time", "f8", ("slot",))[:] = slots
            # hx at slot s of observation o: 100 s + o + member / 10
            ds.createVariable("hx", "f8", ("slot", "obs"))[:] = 100.0 * np.arange(3)[:, None] + np.arange(5) + m / 10
        hx_files.append(f)
    HX = FileObservations(of, layout.n_rows, hx_files).apply(1, np.zeros((10, N), order="F"), 0, SerialComm())
    want_slot = np.array([0, 1, 1, 2, 2])  # nearest slot time: -4.4 -> -3, -0.2 -> 0
    np.testing.assert_array_equal(HX, 100.0 * want_slot[:, None] + np.arange(5)[:, None] + np.arange(N)[None, :] / 10)
    with pytest.raises(FileFormatError, match=r"observation 0 at time -6.0 is outside the window \[-5, 0\]"):
        load_for_state(p, layout, None, cycle=1, settings=ObsSettings(window=(-5.0, 0.0)))


def test_in_process_time_slots_take_each_observations_slot(tmp_path: Path) -> None:
    from enkflow.errors import InputError
    from enkflow.obs.space import SlotObservations

    layout = StateLayout.from_file(_index_grid(tmp_path / "grid.nc", (10,)), ["h"])
    times = np.array([-6.0, -4.4, -3.0, -0.2, 0.0])
    p = _write(tmp_path / "o.nc", np.zeros(5), None, ("x",), np.arange(5) * 2, time=times)
    of = load_for_state(p, layout, None, settings=ObsSettings(window=(-6.0, 0.0)))
    space = SlotObservations(of, layout.n_rows, [-6.0, -3.0, 0.0])
    X = np.asfortranarray(np.arange(10.0)[:, None] + np.arange(N)[None, :] / 10)
    comm = SerialComm()
    for s in range(3):  # the "model" state at slot s: X + 100 s
        space.record(s, np.asfortranarray(X + 100.0 * s), 0, comm)
    HX = space.apply(1, X, 0, comm)
    np.testing.assert_array_equal(HX, X[np.arange(5) * 2] + 100.0 * np.array([0, 1, 1, 2, 2])[:, None])
    space.record(0, X, 0, comm)
    with pytest.raises(InputError, match=r"cycle 2: no H\(x\) was recorded for time slot 1 \(time -3\)"):
        space.apply(2, X, 0, comm)
    no_time = load_for_state(_write(tmp_path / "nt.nc", np.zeros(2), None, ("x",), np.arange(2)), layout, None)
    with pytest.raises(InputError, match="time slots need the observations' times"):
        SlotObservations(no_time, layout.n_rows, [0.0])


def test_bilinear_never_spans_a_masked_column(tmp_path: Path) -> None:
    """A regular grid with a whole column missing from the state: an observation beside the gap takes
    only its corners in the state, never the points across the gap."""
    from enkflow.state.config import MaskConfig

    with netCDF4.Dataset(tmp_path / "g.nc", "w") as ds:
        ds.createDimension("y", 4)
        ds.createDimension("x", 6)
        ds.createVariable("h", "f8", ("y", "x"))[:] = 0.0
        m = np.ones((4, 6), np.int32)
        m[:, 2] = 0  # column x = 2 is not in the state
        ds.createVariable("mask", "i4", ("y", "x"))[:] = m
    layout = StateLayout.from_file(tmp_path / "g.nc", ["h"], mask=MaskConfig(variable="mask"))
    assert 2.0 not in layout.coords[:, 0]
    p = _write(tmp_path / "o.nc", np.zeros(2), np.array([[1.5, 1.0], [3.0, 2.5]]), ("x", "y"), None)
    obs = FileObservations(load_for_state(p, layout, Metric.CARTESIAN,
                                          settings=ObsSettings(ObsSettingsConfig(interpolation="bilinear"))),
                           layout.n_rows)
    field = np.full((4, 6), np.nan)
    field[:, [0, 1, 3, 4, 5]] = np.arange(20.0).reshape(4, 5)
    x = field[:, [0, 1, 3, 4, 5]].ravel()  # the state rows, in row order (y, then x)
    got = obs.apply_analysis(1, x[:, None], 0, SerialComm())[:, 0]
    # (1.5, 1): only the x = 1 corners are in the state -> field[1, 1]; (3, 2.5): on the x = 3 column.
    np.testing.assert_allclose(got, [field[1, 1], 0.5 * (field[2, 3] + field[3, 3])], rtol=0, atol=1e-12)


def test_coordinate_order_matters_only_to_observations_located_by_coordinates(tmp_path: Path) -> None:
    """state.coordinates [y, x] is fine for observations at state rows (the cartesian distance does not
    depend on the column order: the same analysis); nearest and bilinear compare the state's coordinates in
    order with the file's x, y, z, so there [y, x] and [x, depth, y] are errors naming the order to use."""
    with netCDF4.Dataset(tmp_path / "g.nc", "w") as ds:
        for d, n in (("depth", 2), ("y", 6), ("x", 6)):
            ds.createDimension(d, n)
            ds.createVariable(d, "f8", (d,))[:] = np.arange(n) * 10.0
        lat = ds.createVariable("lat", "f8", ("y",))
        lat.units = "degrees_north"
        lat[:] = np.arange(6) * 10.0
        ds.createVariable("h", "f8", ("y", "x"))[:] = 0.0
        ds.createVariable("t", "f8", ("depth", "y", "x"))[:] = 0.0
    xy, yx, latx = (StateLayout.from_file(tmp_path / "g.nc", ["h"], coordinates=c)
                    for c in (["x", "y"], ["y", "x"], ["lat", "x"]))
    X, truth = _ensemble(xy.n_rows)
    idx = np.arange(0, xy.n_rows, 5)
    by_index = _write(tmp_path / "i.nc", truth[idx], None, ("x", "y"), idx)
    loc = LocalizationConfig(radius=25.0, metric=Metric.CARTESIAN)
    ref, _ = _analysis(by_index, xy, loc, "index", X)
    for layout in (yx, latx):
        got, _ = _analysis(by_index, layout, loc, "index", X)
        np.testing.assert_array_equal(got, ref)
    by_coords = _write(tmp_path / "c.nc", truth[idx], xy.coords[idx], ("x", "y"), None)
    for interp in ("nearest", "bilinear"):
        with pytest.raises(ConfigError, match=rf"\['y', 'x'\] list 'y' \(the y axis\) before 'x' \(the x axis\), but "
                           rf"interpolation '{interp}' locates the observations of {tmp_path}/c.nc \(cycle 3\).*"
                           r"the file's x, y: list them as \['x', 'y'\]") as ei:
            load_for_state(by_coords, yx, Metric.CARTESIAN, cycle=3,
                           settings=ObsSettings(ObsSettingsConfig(interpolation=interp)))
        assert ei.value.key == "state.coordinates"
    deep = StateLayout.from_file(tmp_path / "g.nc", ["t"], coordinates=["x", "depth", "y"])
    xyz = _write(tmp_path / "z.nc", np.zeros(1), np.array([[10.0, 10.0, 0.0]]), ("x", "y", "z"), None)
    with pytest.raises(ConfigError, match=r"list 'depth' \(the z axis\) before 'y' \(the y axis\).*"
                                          r"list them as \['x', 'y', 'depth'\]"):
        load_for_state(xyz, deep, Metric.CARTESIAN, settings=ObsSettings(ObsSettingsConfig(interpolation="nearest")))
