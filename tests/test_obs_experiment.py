"""Issue 14 through `enkflow run`: observations by lon/lat give the run of the same observations by
state_index, bitwise; QC rejections per kind and cycle reach the report (`enkflow report --json`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.cli import main
from jobs_helpers.experiments import restarts
from test_obs_precheck import CYCLES, N, _experiment


def _by_coordinates(path: Path, synth: Path) -> None:
    """Drop state_index, give lon/lat of the observed land points (on grid points)."""
    with netCDF4.Dataset(synth / "member_0001.nc") as ds:
        lon, lat = np.asarray(ds["land_lon"][:]), np.asarray(ds["land_lat"][:])
    with netCDF4.Dataset(path) as src:
        data = {n: np.asarray(src[n][:]) for n in ("value", "error_std", "kind", "state_index")}
        kind_attrs = {a: src["kind"].getncattr(a) for a in src["kind"].ncattrs()}
    path.unlink()
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("obs", data["value"].size)
        for n in ("value", "error_std"):
            ds.createVariable(n, "f8", ("obs",))[:] = data[n]
        k = ds.createVariable("kind", "i4", ("obs",))
        k.setncatts(kind_attrs)
        k[:] = data["kind"]
        ds.createVariable("lon", "f8", ("obs",))[:] = lon[data["state_index"]]
        ds.createVariable("lat", "f8", ("obs",))[:] = lat[data["state_index"]]


def test_lonlat_observations_give_the_state_index_run_and_qc_counts_reach_the_report(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qc = '[observations.qc]\ngross_sigma = 4.0\n[observations.kinds.soil_moisture]\nerror_factor = 1.0\n'
    index_toml = _experiment(tmp_path / "index", synth, obs_extra=qc)
    coord_toml = _experiment(tmp_path / "coords", synth, obs_extra='interpolation = "nearest"\n' + qc)
    planted = np.array([3, 40, 77])
    for root in (tmp_path / "index", tmp_path / "coords"):
        with netCDF4.Dataset(root / "obs" / "obs_002.nc", "a") as ds:
            ds["value"][planted] = ds["value"][planted] + 10 * ds["error_std"][planted]
        if root.name == "coords":
            for k in range(1, CYCLES + 1):
                _by_coordinates(root / "obs" / f"obs_{k:03d}.nc", synth)
    for toml in (index_toml, coord_toml):
        assert main(["run", "--quiet", str(toml)]) == 0
    for a, b in zip(restarts(tmp_path / "index", N), restarts(tmp_path / "coords", N)):
        assert np.array_equal(a, b)
    capsys.readouterr()
    assert main(["report", "--json", str(tmp_path / "coords" / "exp")]) == 0
    rep = json.loads(capsys.readouterr().out)
    cycles = {c["cycle"]: c["analysis"] for c in rep["cycles"]}
    # Exactly the planted errors of cycle 2 are rejected; the other cycles keep every observation.
    assert cycles[2]["qc_rejected"] == cycles[2]["qc_gross"] == cycles[2]["qc_rejected:soil_moisture"] == planted.size
    assert cycles[2]["qc_buddy"] == 0 and cycles[2]["n_obs"] == cycles[1]["n_obs"] - planted.size
    assert cycles[1]["qc_rejected"] == cycles[3]["qc_rejected"] == 0
