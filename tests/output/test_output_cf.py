"""CF-1.8 compliance of every kind of file the writer makes: checked by the IOOS compliance-checker
(PyPI, in the dev extra) in its strict mode when it is installed, and by explicit attribute tests always."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.output import Output


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both layouts: one NetCDF-4 file per time (zstd) and the growing CDF-5 files."""
    top = tmp_path_factory.mktemp("cf")
    d, g = top / "out", top / "growing"
    cfg: dict[str, Any] = {
        "directory": str(d), "file": "{field}_{time:g}.nc", "members": 3, "title": "cf test",
        "dims": {"lat": {"size": 6, "start": -75.0, "step": 30.0, "units": "degrees_north", "standard_name": "latitude",
                         "axis": "Y"},
                 "lon": {"size": 8, "start": 0.0, "step": 45.0, "units": "degrees_east", "standard_name": "longitude",
                         "axis": "X"}},
        "fields": {"sm": {"dims": ["lat", "lon"], "units": "m3 m-3", "long_name": "soil moisture",
                          "standard_name": "volume_fraction_of_condensed_water_in_soil",
                          "dtype": "int16", "pack_range": [0.0, 1.0]},
                   "sst": {"dims": ["lat", "lon"], "units": "K", "standard_name": "sea_surface_temperature",
                           "ensemble": False}},
        "windows": [{"name": "day", "length": 24.0}], "compression": "zstd",
    }
    growing = dict(cfg, directory=str(g), file="{field}.nc", compression=None)
    for c in (cfg, growing):
        rng = np.random.default_rng(0)
        with Output(c) as out:
            for t in (0.0, 12.0, 24.0):
                for m in (1, 2, 3):
                    out.add("sm", rng.uniform(0.1, 0.9, (6, 8)), time=t, member=m)
                out.add("sst", 290 + rng.standard_normal((6, 8)), time=t)
    return {"ensemble": d / "sm_0.nc", "single": d / "sst_12.nc", "window": d / "sm_day_0.nc",
            "window_single": d / "sst_day_0.nc", "growing": g / "sm.nc", "growing_single": g / "sst.nc",
            "growing_window": g / "sm_day.nc"}


# CF-1.8 7.3: a cell_methods name "can be a dimension of the variable, a scalar coordinate variable, a valid
# standard name, or the word area"; "realization: mean" names member(member)'s standard name (a scalar
# coordinate beside it would be a second realization variable). The checker knows only the first two forms.
_REALIZATION = "cell_methods name component realization does not match a dimension, area or auxiliary coordinate"


def _checker() -> str | None:
    exe = Path(sys.executable).parent / "compliance-checker"
    return str(exe) if exe.exists() else shutil.which("compliance-checker")


@pytest.mark.parametrize("kind", ["ensemble", "single", "window", "window_single", "growing", "growing_single",
                                  "growing_window"])
def test_compliance_checker_cf_1_8_strict(files: dict[str, Path], kind: str, tmp_path: Path) -> None:
    exe = _checker()
    if exe is None:
        pytest.skip("compliance-checker is not installed (pip install compliance-checker); "
                    "the attribute tests below still run")
    report = tmp_path / "report.json"
    r = subprocess.run([exe, "--test", "cf:1.8", "--criteria", "strict", "-f", "json", "-o", str(report),
                        str(files[kind])], capture_output=True, text=True, timeout=120)
    data = json.loads(report.read_text())
    res = data["cf:1.8"]
    problems = [(p["name"], [m for m in p["msgs"] if _REALIZATION not in m])
                for group in ("high_priorities", "medium_priorities", "low_priorities")
                for p in res.get(group, []) if p["value"][0] < p["value"][1]]
    assert not [p for p in problems if p[1]], f"{files[kind].name}: {problems}\n{r.stdout[-2000:]}"


def test_required_attributes(files: dict[str, Path]) -> None:
    with netCDF4.Dataset(files["ensemble"]) as ds:
        assert ds.Conventions == "CF-1.8" and ds.history and ds.title == "cf test"
        t = ds["time"]
        assert t.units == "hours since 2000-01-01 00:00:00" and t.calendar == "standard" and t.axis == "T"
        assert ds["lat"].units == "degrees_north" and ds["lat"].standard_name == "latitude"
        assert ds["lon"].axis == "X"
        v = ds["sm"]
        assert v.dimensions == ("time", "member", "lat", "lon")
        assert v.standard_name == "volume_fraction_of_condensed_water_in_soil" and v.units == "m3 m-3"
        assert v.dtype == np.int16 and v._FillValue == -32768
        assert {"scale_factor", "add_offset", "packing_error_bound"} <= set(v.ncattrs())
        assert v.filters()["zstd"]
        assert ds["sm_mean"].cell_methods == "realization: mean"
        assert ds["sm_spread"].cell_methods == "realization: standard_deviation"
        assert ds["member"].standard_name == "realization"
        assert [v for v in ds.variables if getattr(ds[v], "standard_name", "") == "realization"] == ["member"]
    with netCDF4.Dataset(files["window"]) as ds:
        assert ds["time"].bounds == "time_bnds" and list(ds["time_bnds"][0]) == [0.0, 24.0]
        assert float(ds["time"][0]) == 12.0 and ds.number_of_times == 2 and ds.window_complete == 1
        for s, m in (("mean", "mean"), ("min", "minimum"), ("max", "maximum")):
            assert ds[f"sm_{s}"].cell_methods == f"realization: mean time: {m}"
    with netCDF4.Dataset(files["window_single"]) as ds:
        assert ds["sst_mean"].cell_methods == "time: mean"
    with netCDF4.Dataset(files["single"]) as ds:
        assert ds["sst"].dimensions == ("time", "lat", "lon") and ds["sst"].dtype == np.float32
        assert "sst_mean" not in ds.variables


def test_growing_files_hold_every_time_with_the_same_attributes(files: dict[str, Path]) -> None:
    with netCDF4.Dataset(files["growing"]) as ds, netCDF4.Dataset(files["ensemble"]) as one:
        assert ds.data_model == "NETCDF3_64BIT_DATA" and list(ds["time"][:]) == [0.0, 12.0, 24.0]
        for name in ("time", "lat", "lon", "member", "sm", "sm_mean", "sm_spread"):
            assert ds[name].dimensions == one[name].dimensions
            assert {k: str(ds[name].getncattr(k)) for k in ds[name].ncattrs()} == \
                {k: str(one[name].getncattr(k)) for k in one[name].ncattrs()}
        one.set_auto_maskandscale(False)
        ds.set_auto_maskandscale(False)
        for name in ("sm", "sm_mean", "sm_spread"):
            np.testing.assert_array_equal(ds[name][0], one[name][0])
        assert ds["member"].standard_name == "realization" and "realization" not in ds.variables
    with netCDF4.Dataset(files["growing_window"]) as ds:
        assert list(ds["time"][:]) == [12.0] and list(ds["time_bnds"][0]) == [0.0, 24.0]
        assert list(ds["number_of_times"][:]) == [2] and list(ds["window_complete"][:]) == [1]
        assert ds.window == "day" and ds["sm_mean"].cell_methods == "realization: mean time: mean"
