"""Reading and writing observation files (enkflow.obs.obsfile)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.errors import FileFormatError, InputError
from enkflow.obs.obsfile import ObsFile, read_obs_file, write_obs_file
from enkflow.analysis.obsset import ObsSet

N = 6


def _obsfile() -> ObsFile:
    lon = np.linspace(-170.0, 170.0, N)
    lat = np.linspace(-80.0, 80.0, N)
    obs = ObsSet(np.arange(N) * 0.1, np.full(N, 0.25**2), np.column_stack([lon, lat]), np.array([0, 1, 0, 1, 0, 0]))
    return ObsFile(obs, np.array([3, 9, 10, 40, 41, 99]), {"title": "test", "seed": np.int64(4)})


def _raw(path: Path, *, skip: tuple[str, ...] = (), **override: Any) -> Path:
    """A hand-made observation file; ``override`` replaces variable data, ``skip`` leaves variables out."""
    data: dict[str, tuple[str, Any]] = {
        "value": ("f8", np.arange(N) * 0.1),
        "error_std": ("f8", np.full(N, 0.5)),
        "lon": ("f8", np.linspace(0.0, 50.0, N)),
        "lat": ("f8", np.linspace(-60.0, 60.0, N)),
        "state_index": ("i8", np.arange(N) * 2),
        "kind": ("i4", np.zeros(N)),
    }
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", N)
        for name, values in override.items():
            data[name] = (np.asarray(values).dtype, values)
        for name, (dtype, values) in data.items():
            if name in skip:
                continue
            v = ds.createVariable(name, dtype, ("obs",))
            v[:] = values
    return path


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_DATA"])
def test_round_trip(tmp_path: Path, fmt: str) -> None:
    src = _obsfile()
    write_obs_file(tmp_path / "o.nc", src, format=fmt, units="m3 m-3", kind_names=["a", "b"])
    got = read_obs_file(tmp_path / "o.nc", n_state=100)
    np.testing.assert_array_equal(got.obs.values, src.obs.values)
    np.testing.assert_array_equal(got.obs.error_var, src.obs.error_var)
    np.testing.assert_array_equal(got.obs.coords, src.obs.coords)
    np.testing.assert_array_equal(got.obs.kinds, src.obs.kinds)
    np.testing.assert_array_equal(got.state_index, src.state_index)
    assert got.state_index.dtype == np.int64 and got.obs.kinds.dtype == np.int32
    assert got.attrs["title"] == "test" and got.attrs["seed"] == 4
    with netCDF4.Dataset(tmp_path / "o.nc") as ds:
        assert ds["error_std"][0] == 0.25 and ds["value"].units == "m3 m-3"
        assert ds["kind"].flag_meanings == "a b" and ds["lat"].units == "degrees_north"


def test_error_var_variable_and_optional_kind(tmp_path: Path) -> None:
    p = _raw(tmp_path / "o.nc", skip=("error_std", "kind"), error_var=np.full(N, 0.04))
    got = read_obs_file(p)
    np.testing.assert_array_equal(got.obs.error_var, 0.04)
    np.testing.assert_array_equal(got.obs.kinds, 0)


@pytest.mark.parametrize(
    ("variable", "data", "message"),
    [
        ("value", np.array([0.0, 1.0, np.nan, 0.0, 0.0, 0.0]), "NaN or Inf at index 2"),
        ("error_std", np.array([0.5, 0.5, 0.5, 0.0, 0.5, 0.5]), "must be > 0; index 3"),
        ("error_std", np.array([0.5, -1.0, 0.5, 0.5, 0.5, 0.5]), "must be > 0; index 1"),
        ("error_std", np.array([0.5, 0.5, 0.5, 0.5, 0.5, np.inf]), "NaN or Inf at index 5"),
        ("lon", np.array([0.0, 0.0, 0.0, 0.0, -np.inf, 0.0]), "NaN or Inf at index 4"),
        ("lat", np.array([0.0, 91.0, 0.0, 0.0, 0.0, 0.0]), r"\[-90, 90\] degrees; index 1"),
        ("state_index", np.array([0, 1, -2, 3, 4, 5], dtype=np.int64), "must be >= 0; index 2"),
        ("state_index", np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), "must be an integer variable"),
        ("value", np.zeros(N, dtype=np.int32), None),
    ],
)
def test_bad_values_name_file_variable_and_index(tmp_path: Path, variable: str, data: np.ndarray, message: str | None) -> None:
    p = _raw(tmp_path / "bad.nc", **{variable: data})
    if message is None:  # integer values are acceptable: they are read as float64
        assert read_obs_file(p).obs.values.dtype == np.float64
        return
    with pytest.raises(FileFormatError, match=message) as e:
        read_obs_file(p)
    assert e.value.variable == variable
    assert e.value.path == str(p) and str(p) in str(e.value) and f"variable '{variable}'" in str(e.value)


def test_state_index_beyond_state(tmp_path: Path) -> None:
    p = _raw(tmp_path / "o.nc")
    read_obs_file(p, n_state=11)
    with pytest.raises(FileFormatError, match="< n_state = 10; index 5 has 10") as e:
        read_obs_file(p, n_state=10)
    assert e.value.variable == "state_index"


def test_fill_value_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "o.nc"
    _raw(p)
    with netCDF4.Dataset(p, "a") as ds:
        ds["value"].setncattr("missing_value", 0.2)  # the third value is 0.2 exactly
    with pytest.raises(FileFormatError, match="missing value") as e:
        read_obs_file(p)
    assert e.value.variable == "value"


@pytest.mark.parametrize("missing", ["value", "lon", "lat", "state_index"])
def test_missing_variable(tmp_path: Path, missing: str) -> None:
    p = _raw(tmp_path / "o.nc", skip=(missing,))
    with pytest.raises(FileFormatError, match="variable missing") as e:
        read_obs_file(p)
    assert e.value.variable == missing


def test_missing_error_variable(tmp_path: Path) -> None:
    p = _raw(tmp_path / "o.nc", skip=("error_std",))
    with pytest.raises(FileFormatError, match="error_var") as e:
        read_obs_file(p)
    assert e.value.variable == "error_std"


def test_wrong_dimensions(tmp_path: Path) -> None:
    p = tmp_path / "o.nc"
    with netCDF4.Dataset(p, "w") as ds:
        ds.createDimension("obs", 2)
        ds.createDimension("x", 2)
        ds.createVariable("value", "f8", ("x",))[:] = [1.0, 2.0]
    with pytest.raises(FileFormatError, match=r"dimensions \('x',\), expected \('obs',\)") as e:
        read_obs_file(p)
    assert e.value.variable == "value"
    with netCDF4.Dataset(tmp_path / "nodim.nc", "w") as ds:
        ds.createDimension("x", 2)
    with pytest.raises(FileFormatError, match="no 'obs' dimension"):
        read_obs_file(tmp_path / "nodim.nc")


def test_not_a_file_or_not_netcdf(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="not found"):
        read_obs_file(tmp_path / "absent.nc")
    (tmp_path / "junk.nc").write_text("not netcdf")
    with pytest.raises(FileFormatError, match="cannot be opened as NetCDF") as e:
        read_obs_file(tmp_path / "junk.nc")
    assert e.value.path == str(tmp_path / "junk.nc")


def test_empty_file_is_valid(tmp_path: Path) -> None:
    src = ObsFile(ObsSet(np.zeros(0), np.zeros(0), np.zeros((0, 2))), np.zeros(0, np.int64))
    write_obs_file(tmp_path / "e.nc", src)
    got = read_obs_file(tmp_path / "e.nc", n_state=5)
    assert got.n_obs == 0 and got.obs.coords.shape == (0, 2)


def test_obsfile_validation() -> None:
    obs = _obsfile().obs
    with pytest.raises(InputError, match="state_index has 2 elements, expected 6"):
        ObsFile(obs, np.array([0, 1]))
    with pytest.raises(InputError, match="must be >= 0; observation 1"):
        ObsFile(obs, np.array([0, -1, 2, 3, 4, 5]))
    with pytest.raises(InputError, match="integer"):
        ObsFile(obs, np.zeros(N))
    with pytest.raises(InputError, match="int64"):
        write_obs_file("unused.nc", _obsfile(), format="NETCDF3_CLASSIC")
    one_d = ObsFile(ObsSet(np.zeros(2), np.ones(2), np.zeros(2)), np.array([0, 1]))
    with pytest.raises(InputError, match="expected 2 \\(lon, lat"):
        write_obs_file("unused.nc", one_d)
