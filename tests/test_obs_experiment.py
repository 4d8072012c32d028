"""Issue 14 through `enkflow run`: observations by lon/lat give the run of the same observations by
state_index, bitwise, and so does H(x) per time slot from an operator stage (each observation's slot);
QC rejections per kind and cycle reach the report (`enkflow report --json`)."""

from __future__ import annotations

import json
import sys
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


OPERATOR = """
import sys
import netCDF4
import numpy as np

restart, obs, output = sys.argv[1:]
with netCDF4.Dataset(restart) as ds:
    x = np.asarray(ds["soil_moisture"][:], dtype=np.float64).ravel()
with netCDF4.Dataset(obs) as ds:
    idx = np.asarray(ds["state_index"][:])
with netCDF4.Dataset(output, "w") as ds:
    ds.createDimension("slot", 2)
    ds.createDimension("obs", idx.size)
    ds.createVariable("slot_time", "f8", ("slot",))[:] = [-6.0, 0.0]
    hx = ds.createVariable("hx", "f8", ("slot", "obs"))
    hx[0, :] = x[idx] + 1000.0  # an earlier slot, far off: taking it would wreck the analysis
    hx[1, :] = x[idx]
"""


def _with_times(path: Path) -> None:
    with netCDF4.Dataset(path, "a") as ds:
        ds.createVariable("time", "f8", ("obs",))[:] = np.linspace(-1.0, 0.0, len(ds.dimensions["obs"]))


def test_lonlat_observations_give_the_state_index_run_and_qc_counts_reach_the_report(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qc = '[observations.qc]\ngross_sigma = 4.0\n[observations.kinds.soil_moisture]\nerror_factor = 1.0\n'
    index_toml = _experiment(tmp_path / "index", synth, obs_extra=qc)
    coord_toml = _experiment(tmp_path / "coords", synth, obs_extra='interpolation = "nearest"\n' + qc)
    # H(x) per time slot from an operator stage (4-D / FGAT): each observation takes the slot nearest its time.
    (tmp_path / "op.py").write_text(OPERATOR)
    fgat_toml = _experiment(tmp_path / "fgat", synth, obs_extra=(
        f'operator = "{sys.executable} {tmp_path / "op.py"} {{restart}} {{obs}} {{output}}"\n'
        'operator_output = "hx/hx_{cycle}_{member}.nc"\n' + qc))
    planted = np.array([3, 40, 77])
    for k in range(1, CYCLES + 1):
        _with_times(tmp_path / "fgat" / "obs" / f"obs_{k:03d}.nc")
    for root in (tmp_path / "index", tmp_path / "coords", tmp_path / "fgat"):
        with netCDF4.Dataset(root / "obs" / "obs_002.nc", "a") as ds:
            ds["value"][planted] = ds["value"][planted] + 10 * ds["error_std"][planted]
        if root.name == "coords":
            for k in range(1, CYCLES + 1):
                _by_coordinates(root / "obs" / f"obs_{k:03d}.nc", synth)
    for toml in (index_toml, coord_toml, fgat_toml):
        assert main(["run", "--quiet", str(toml)]) == 0
    assert (tmp_path / "fgat" / "hx" / "hx_3_4.nc").is_file()
    for other in ("coords", "fgat"):
        for a, b in zip(restarts(tmp_path / "index", N), restarts(tmp_path / other, N)):
            assert np.array_equal(a, b), other
    capsys.readouterr()
    assert main(["report", "--json", str(tmp_path / "coords" / "exp")]) == 0
    rep = json.loads(capsys.readouterr().out)
    cycles = {c["cycle"]: c["analysis"] for c in rep["cycles"]}
    # Exactly the planted errors of cycle 2 are rejected; the other cycles keep every observation.
    assert cycles[2]["qc_rejected"] == cycles[2]["qc_gross"] == cycles[2]["qc_rejected:soil_moisture"] == planted.size
    assert cycles[2]["qc_buddy"] == 0 and cycles[2]["n_obs"] == cycles[1]["n_obs"] - planted.size
    assert cycles[1]["qc_rejected"] == cycles[3]["qc_rejected"] == 0
    assert main(["report", str(tmp_path / "coords" / "exp")]) == 0  # the table takes the new keys too
