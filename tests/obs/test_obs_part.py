"""A part of an observation file (issue 23): observations [start, stop) read, checked and located
give exactly the rows of the whole file's result; errors name an observation by its index in the
file; H(x) of an operator stage read for some observations only."""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.config import LocalizationConfig, Metric
from enkflow.errors import FileFormatError, InputError
from enkflow.obs import space
from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.fileformat import ObsFile
from enkflow.obs.load import with_kind_arrays
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.reader import ObsPart, obs_count, parts_of, read_obs_file
from enkflow.obs.space import read_given_hx
from enkflow.state import StateLayout

LON = np.arange(0.0, 360.0, 20.0)  # a global regular grid: 18 x 9
LAT = np.arange(-80.0, 90.0, 20.0)
N_OBS = 50
PARTS = [ObsPart(0, 17), ObsPart(17, 17), ObsPart(17, 40), ObsPart(40, N_OBS)]
KINDS = {"buoy": {"radius": 2500.0}, "ship": {"code": 1, "error_factor": 2.0, "qc_sigma": 3.0}}


def _state(path: Path) -> StateLayout:
    """``h(lat, lon)`` and a vertical coordinate ``zc(lat, lon)`` of every row, in [0, 10]."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("lat", LAT.size)
        ds.createDimension("lon", LON.size)
        for name, axis, units in (("lat", LAT, "degrees_north"), ("lon", LON, "degrees_east")):
            v = ds.createVariable(name, "f8", (name,))
            v.units = units
            v[:] = axis
        ds.createVariable("h", "f8", ("lat", "lon"))[:] = 0.0
        ds.createVariable("zc", "f8", ("lat", "lon"))[:] = np.linspace(0.0, 10.0, LAT.size * LON.size).reshape(
            LAT.size, LON.size)
    return StateLayout.from_file(path, ["h"])


def _obs(path: Path, n_rows: int, **spoil: tuple[int, float]) -> Path:
    """N_OBS observations of two kinds, with times, levels, lon/lat and state_index; ``spoil`` sets
    one value of a variable (name=(index, value))."""
    rng = np.random.default_rng(23)
    data = {
        "value": rng.normal(size=N_OBS), "error_std": rng.uniform(0.3, 1.0, N_OBS),
        "lon": rng.uniform(0.0, 360.0, N_OBS), "lat": rng.uniform(-80.0, 80.0, N_OBS),
        "time": rng.uniform(-6.0, 0.0, N_OBS), "level": rng.uniform(0.0, 10.0, N_OBS),
    }
    for i in rng.choice(N_OBS, 6, replace=False):  # some on grid lines, the odd ones on grid points
        data["lon"][i] = LON[i % LON.size]
        if i % 2:
            data["lat"][i] = LAT[i % LAT.size]
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", N_OBS)
        for name, values in data.items():
            ds.createVariable(name, "f8", ("obs",))[:] = values
        ds.createVariable("state_index", "i8", ("obs",))[:] = rng.integers(0, n_rows, N_OBS)
        ds.createVariable("kind", "i4", ("obs",))[:] = rng.integers(0, 2, N_OBS)
        ds["kind"].setncatts({"flag_values": np.array([0, 1], np.int32), "flag_meanings": "buoy ship"})
        for name, (i, value) in spoil.items():
            ds[name][i] = value
    return path


def _settings(interpolation: str) -> ObsSettings:
    loc = LocalizationConfig(radius=1500.0, metric=Metric.SPHERE, vertical_radius=3.0, vertical_coordinate="zc")
    return ObsSettings(ObsSettingsConfig(interpolation=interpolation, kinds=KINDS), loc, window=(-6.0, 0.0))


def _rows(of: ObsFile, n_rows: int, part: ObsPart) -> list[np.ndarray]:
    """Every per-observation array of ``of`` (H as CSR) for the observations ``part`` of it."""
    H = of.operator_for(n_rows).H
    indptr, indices, data = H.indptr.astype(np.int64), H.indices.astype(np.int64), H.data
    a, b = indptr[part.start], indptr[part.stop]
    arrays = [of.obs.values, of.obs.error_var, of.obs.coords, of.obs.kinds, of.obs.half_width, of.obs.vcoord,
              of.time, of.qc_sigma, of.state_index]
    return [x[part.start:part.stop] for x in arrays if x is not None] + [
        indptr[part.start:part.stop + 1] - a, indices[a:b], data[a:b]]


@pytest.mark.parametrize("interpolation", ["index", "nearest", "bilinear"])
def test_the_parts_of_a_file_are_the_rows_of_the_whole(tmp_path: Path, interpolation: str) -> None:
    layout = _state(tmp_path / "grid.nc")
    path = _obs(tmp_path / "obs.nc", layout.n_rows)
    settings = _settings(interpolation)
    whole = load_for_state(path, layout, Metric.SPHERE, cycle=2, settings=settings)
    assert obs_count(path, 2) == N_OBS == whole.n_obs
    assert whole.obs.vcoord is not None and whole.obs.half_width is not None and whole.qc_sigma is not None
    everything = load_for_state(path, layout, Metric.SPHERE, cycle=2, settings=settings, part=ObsPart(0, N_OBS))
    for got, want in zip(_rows(everything, layout.n_rows, ObsPart(0, N_OBS)), _rows(whole, layout.n_rows,
                                                                                     ObsPart(0, N_OBS))):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    for part in PARTS:
        of = load_for_state(path, layout, Metric.SPHERE, cycle=2, settings=settings, part=part)
        assert of.n_obs == part.size and of.kind_names == whole.kind_names and of.lonlat == whole.lonlat
        if part.size == 0:  # no observation of a kind with its own radius or threshold: as the whole has
            assert of.obs.half_width is None and of.qc_sigma is None
        of = with_kind_arrays(of, settings, half_width=True, qc_sigma=True)
        got, want = _rows(of, layout.n_rows, ObsPart(0, part.size)), _rows(whole, layout.n_rows, part)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)


@pytest.mark.parametrize("interpolation, spoil, variable, message", [
    ("index", {"value": (37, np.nan)}, "value", "holds NaN or Inf at index 37"),
    ("index", {"error_std": (41, -1.0)}, "error_std", "must be > 0; index 41 has -1.0"),
    ("index", {"state_index": (44, 10**6)}, "state_index", r"must be < n_state = 162; index 44 has 1000000"),
    ("nearest", {"lat": (33, 95.0)}, "lat", r"must lie in \[-90, 90\] degrees; index 33 has 95.0"),
    ("bilinear", {"lat": (33, 85.0)}, "lat", r"observation 33 at \(.*, 85\) is outside the domain of state "
                                             "variable 'h': lat must lie in"),
    ("nearest", {"time": (46, 1.0)}, "time", r"observation 46 at time 1.0 is outside the window \[-6, 0\]"),
    ("index", {"kind": (42, 5)}, "kind", "kind 5 of observation 42 is not a configured kind"),
    ("bilinear", {"level": (48, 11.0)}, "level", "observation 48 at level 11.0 is outside the state's vertical"),
])
def test_a_bad_observation_of_a_later_part_is_named_by_its_index_in_the_file(
        tmp_path: Path, interpolation: str, spoil: dict[str, tuple[int, float]], variable: str, message: str) -> None:
    layout = _state(tmp_path / "grid.nc")
    path = _obs(tmp_path / "obs.nc", layout.n_rows, **spoil)
    settings = _settings(interpolation)
    load_for_state(path, layout, Metric.SPHERE, cycle=4, settings=settings, part=ObsPart(0, 30))
    for part in (ObsPart(30, N_OBS), None):  # the part that holds it, and the whole file: the same message
        with pytest.raises(FileFormatError, match=message) as ei:
            load_for_state(path, layout, Metric.SPHERE, cycle=4, settings=settings, part=part)
        assert ei.value.variable == variable and "(observation file of cycle 4)" in str(ei.value)
        assert str(path) in str(ei.value)


def test_part_bounds_and_the_count_of_a_file(tmp_path: Path) -> None:
    path = _obs(tmp_path / "obs.nc", 10)
    for start, stop in ((-1, 3), (5, 4)):
        with pytest.raises(InputError, match=r"0 <= start <= stop"):
            ObsPart(start, stop)
    with pytest.raises(FileFormatError, match=r"observations \[40, 51\) asked for, but the file has 50") as ei:
        read_obs_file(path, part=ObsPart(40, 51), cycle=3)
    assert ei.value.path == str(path) and "cycle 3" in str(ei.value)
    assert read_obs_file(path, part=ObsPart(50, 50)).n_obs == 0
    assert parts_of(10, 4) == [ObsPart(0, 4), ObsPart(4, 8), ObsPart(8, 10)]
    assert parts_of(0, 4) == [ObsPart(0, 0)] and parts_of(8, 4) == [ObsPart(0, 4), ObsPart(4, 8)]
    with pytest.raises(FileFormatError, match="observation file not found"):
        obs_count(tmp_path / "none.nc", 1)
    with netCDF4.Dataset(tmp_path / "nodim.nc", "w") as ds:
        ds.createDimension("n", 3)
    with pytest.raises(FileFormatError, match="no 'obs' dimension"):
        obs_count(tmp_path / "nodim.nc")


def _hx(path: Path, values: np.ndarray, slot_time: list[float] | None = None) -> Path:
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", values.shape[-1])
        if slot_time is None:
            ds.createVariable("hx", "f8", ("obs",))[:] = values
        else:
            ds.createDimension("slot", len(slot_time))
            ds.createVariable("slot_time", "f8", ("slot",))[:] = slot_time
            ds.createVariable("hx", "f8", ("slot", "obs"))[:] = values
    return path


def test_given_hx_for_some_observations_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(space, "HX_SLICE", 4)  # several reads per member
    rng = np.random.default_rng(5)
    n, time = 23, rng.uniform(-6.0, 0.0, 23)
    flat = [_hx(tmp_path / f"f{m}.nc", rng.normal(size=n)) for m in range(3)]
    slots = [_hx(tmp_path / f"s{m}.nc", rng.normal(size=(2, n)), [-6.0, 0.0]) for m in range(3)]
    ids = np.array([0, 2, 3, 9, 10, 11, 12, 13, 21, 22])
    for paths, t in ((flat, None), (slots, time)):
        whole = read_given_hx(paths, n, t)
        got = read_given_hx(paths, n, None if t is None else t[ids], ids=ids)
        assert got.flags.c_contiguous and got.shape == (ids.size, 3)
        np.testing.assert_array_equal(got, whole[ids])
        assert read_given_hx(paths, n, None if t is None else t[:0], ids=ids[:0]).shape == (0, 3)
    spoilt = _hx(tmp_path / "bad.nc", np.where(np.arange(n) == 17, np.nan, 1.0))
    np.testing.assert_array_equal(read_given_hx([spoilt], n, ids=ids), np.ones((ids.size, 1)))  # 17 not asked for
    with pytest.raises(FileFormatError, match="hx holds NaN or Inf at observation 17"):
        read_given_hx([spoilt], n, ids=np.array([3, 17]))
    with pytest.raises(FileFormatError, match="hx has 23 values, the observation file 24"):
        read_given_hx(flat, 24, ids=ids)
    for bad in (np.array([3, 3]), np.array([5, 2]), np.array([0, 23])):
        with pytest.raises(InputError):
            read_given_hx(flat, n, ids=bad)
    with pytest.raises(InputError, match="obs_time"):
        read_given_hx(slots, n, time, ids=ids)
