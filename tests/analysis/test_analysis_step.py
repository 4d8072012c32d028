"""The built-in analysis of restart files (read -> analyse -> in-place update -> mean/spread)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from enkflow.config import AnalysisConfig
from enkflow.errors import ConfigError, FileFormatError
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.state import StateConfig

N = 10
STATE = StateConfig(variables=["soil_moisture"], coordinates=["land_lon", "land_lat"])


def synth(d: Path, size: str, n: int) -> Path:
    out = subprocess.run([sys.executable, "-m", "enkflow", "synth", "--size", size, "--members", str(n), "--out", str(d)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return d


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("synth"), "tiny", N)


def copy(src: Path, dst: Path, n: int = N) -> list[Path]:
    shutil.copytree(src, dst)
    return [dst / f"member_{m:04d}.nc" for m in range(1, n + 1)]


def analysis(method="lestkf", radius=3000.0):
    return AnalysisConfig.model_validate(
        {"method": method, "localization": {"radius": radius, "convention": "cutoff", "metric": "sphere"}}
    )


def test_analysis_improves_and_updates_only_the_state(tmp_path):
    # The 'small' problem (21,546 points, 2,155 obs): enough observations per domain
    # to pin down the members' phase shift; measured 0.046 -> 0.021.
    src = synth(tmp_path / "src", "small", 20)
    paths = copy(src, tmp_path / "d", 20)
    with netCDF4.Dataset(src / "truth.nc") as ds:
        truth = np.asarray(ds["soil_moisture"][:])
    res = analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, analysis(radius=2000.0), truth=truth,
                        files=AnalysisFiles(mean=tmp_path / "mean.nc", spread=tmp_path / "spread.nc"))
    assert res["rmse_analysis"] < 0.6 * res["rmse_prior"]
    synth_dir = src
    assert res["oma_rms"] < res["omb_rms"]
    for m, p in enumerate(paths, 1):
        with netCDF4.Dataset(p) as a, netCDF4.Dataset(synth_dir / p.name) as b:
            assert not np.array_equal(a["soil_moisture"][:], b["soil_moisture"][:])
            for v in ("land_lon", "land_lat", "patch_fraction", "land_i"):
                assert np.array_equal(a[v][:], b[v][:])
    with netCDF4.Dataset(tmp_path / "mean.nc") as ds:
        mean = np.asarray(ds["soil_moisture"][:]).ravel()
    cols = []
    for p in paths:
        with netCDF4.Dataset(p) as ds:
            cols.append(np.asarray(ds["soil_moisture"][:]))
    X = np.stack(cols, axis=1)
    assert np.allclose(np.sort(mean[np.isfinite(mean)]), np.sort(X.mean(axis=1)))


@pytest.mark.parametrize("method", ["etkf", "enkf", "letkf"])
def test_other_methods_run(synth_dir, tmp_path, method):
    paths = copy(synth_dir, tmp_path / "d")
    cfg = AnalysisConfig.model_validate({"method": method}) if method in ("etkf", "enkf") else analysis("letkf")
    res = analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, cfg)
    assert res["oma_rms"] < res["omb_rms"]


def test_errors_before_any_write(synth_dir, tmp_path):
    paths = copy(synth_dir, tmp_path / "d")
    before = [p.read_bytes() for p in paths]
    with pytest.raises(FileFormatError, match="observation file not found"):
        analyse_files(paths, tmp_path / "missing.nc", STATE, analysis())
    bad_state = StateConfig(variables=["soil_moisture"], coordinates=["land_i", "land_j"])
    with pytest.raises(ConfigError, match="analysis.localization.metric"):
        analyse_files(paths, tmp_path / "d" / "obs.nc", bad_state, analysis())
    # A member whose structure differs: the I/O layer names it, nothing is written.
    with netCDF4.Dataset(paths[3], "a") as ds:
        ds.createVariable("extra", "f8", ("land",))
    with pytest.raises(FileFormatError, match="member_0004.nc"):
        analyse_files(paths, tmp_path / "d" / "obs.nc", STATE, analysis())
    assert [p.read_bytes() for p in paths[:3]] == before[:3]
