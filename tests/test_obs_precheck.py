"""Every cycle's observation file is checked before the first forecast (issue 9, defect 4).

A defect in cycle 3's file used to surface only in cycle 3's analysis, after the
forecasts of cycles 1 to 3 had rewritten the restarts. With the built-in analysis
``enkflow run`` now fails before any member runs, naming file, variable, cycle
and the first bad index; with an external analysis only existence is checked.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest

from enkflow.cli import main
from enkflow.errors import FileFormatError
from enkflow.experiment import checks, load_experiment
from enkflow.obs.obsfile import ObsFile, load_for_state
from jobs_helpers.experiments import restarts

N = 4
CYCLES = 3


def _experiment(root: Path, synth: Path, *, external: bool = False, obs_extra: str = "", loc_extra: str = "") -> Path:
    """``root/exp.toml``: N members of the tiny land problem, the bundled model, the built-in LETKF."""
    (root / "members").mkdir(parents=True)
    (root / "obs").mkdir()
    for m in range(1, N + 1):
        shutil.copyfile(synth / f"member_{m:04d}.nc", root / "members" / f"member_{m:04d}.nc")
    for k in range(1, CYCLES + 1):
        shutil.copyfile(synth / "obs.nc", root / "obs" / f"obs_{k:03d}.nc")
    py = sys.executable
    analysis = (f'[analysis_task]\ncommand = "{py} -c pass"\n' if external else
                '[state]\nvariables = ["soil_moisture"]\ncoordinates = ["land_lon", "land_lat"]\n\n'
                '[analysis]\nmethod = "letkf"\n'
                f'localization = {{ radius = 1500.0, metric = "sphere"{loc_extra} }}\n')
    (root / "exp.toml").write_text(f'''
[experiment]
directory = "exp"
cycles = {CYCLES}
members = {N}
restart = "members/member_{{member:04d}}.nc"
forecast_length = 6

[model]
command = "{py} -m enkflow.cli.model {{restart}} --length {{length}} --cycle {{cycle}}"

[observations]
file = "obs/obs_{{cycle:03d}}.nc"
{obs_extra}
{analysis}
[jobs]
workers = 2
poll = 0.1
''')
    return root / "exp.toml"


def _spoil(path: Path, variable: str, index: int, value: float) -> None:
    with netCDF4.Dataset(path, "a") as ds:
        ds[variable][index] = value


@pytest.mark.parametrize("variable, index, value, message", [
    ("value", 5, np.nan, "holds NaN or Inf at index 5"),
    ("error_std", 2, 0.0, "must be > 0; index 2 has 0.0"),
    ("error_std", 4, -0.5, "must be > 0; index 4 has -0.5"),
    ("state_index", 7, 877, "must be < n_state = 877; index 7 has 877"),
])
def test_bad_observation_file_of_cycle_3_stops_the_run_before_any_forecast(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str],
        variable: str, index: int, value: float, message: str) -> None:
    toml = _experiment(tmp_path, synth)
    bad = tmp_path / "obs" / "obs_003.nc"
    _spoil(bad, variable, index, value)
    before = restarts(tmp_path, N)
    assert main(["run", "--quiet", str(toml)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, variable '{variable}'" in err and "(observation file of cycle 3)" in err
    assert re.search(message, err), err
    # No forecast ran: the restarts are untouched, no task ended, no cycle was started.
    for a, b in zip(restarts(tmp_path, N), before):
        assert np.array_equal(a, b)
    events = tmp_path / "exp" / "events.jsonl"
    assert not events.exists() or '"task_end"' not in events.read_text()
    assert not (tmp_path / "exp" / "cycles").exists()


def _add_time(path: Path, times: np.ndarray) -> None:
    with netCDF4.Dataset(path, "a") as ds:
        ds.createVariable("time", "f8", ("obs",))[:] = times


def _n_obs(path: Path) -> int:
    with netCDF4.Dataset(path) as ds:
        return len(ds.dimensions["obs"])


# Issue 14: bad input of the new observation keys, each stopping the run before the first forecast.
KIND_TABLE = '[observations.kinds.soil_moisture]\nerror_factor = 1.2\nqc_sigma = 5.0\n'
NEAREST = 'interpolation = "nearest"\n'
BILINEAR = 'interpolation = "bilinear"\n'


@pytest.mark.parametrize("obs_extra, spoil, variable, message", [
    # The file's kind 0 is 'soil_moisture' (flag_meanings): configured; a kind 7 is not.
    (KIND_TABLE, lambda p: _spoil(p, "kind", 4, 7), "kind",
     r"kind 7 of observation 4 is not a configured kind; \[observations.kinds\] has soil_moisture"),
    # Times relative to the analysis time; the default window is [-forecast_length, 0] = [-6, 0].
    ("", lambda p: _add_time(p, np.r_[-3.0, -1.0, 1.5, np.zeros(_n_obs(p) - 3)]), "time",
     r"observation 2 at time 1.5 is outside the window \[-6, 0\]"),
    ('window = [-3.0, 0.0]\n', lambda p: _add_time(p, np.r_[-4.0, np.zeros(_n_obs(p) - 1)]), "time",
     r"observation 0 at time -4.0 is outside the window \[-3, 0\]"),
    # Located by their coordinates: lon/lat must be on the globe, and inside the state's grid.
    (NEAREST, lambda p: _spoil(p, "lat", 3, 95.0), "lat", r"must lie in \[-90, 90\] degrees; index 3 has 95.0"),
    (BILINEAR, lambda p: _spoil(p, "lat", 6, 89.99), "lat",
     r"observation 6 at \(.*, 89.99\) is outside the domain of state variable 'soil_moisture': lat must lie in"),
])
def test_bad_observation_settings_input_stops_the_run_before_any_forecast(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str],
        obs_extra: str, spoil, variable: str, message: str) -> None:
    toml = _experiment(tmp_path, synth, obs_extra=obs_extra)
    bad = tmp_path / "obs" / "obs_003.nc"
    spoil(bad)
    before = restarts(tmp_path, N)
    assert main(["run", "--quiet", str(toml)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, variable '{variable}'" in err and "(observation file of cycle 3)" in err, err
    assert re.search(message, err), err
    for a, b in zip(restarts(tmp_path, N), before):
        assert np.array_equal(a, b)
    events = tmp_path / "exp" / "events.jsonl"
    assert not events.exists() or '"task_end"' not in events.read_text()
    assert not (tmp_path / "exp" / "cycles").exists()


def test_a_missing_vertical_coordinate_stops_the_run_before_any_forecast(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The land state is one level of land points: it has no 'lev' dimension and no such variable.
    toml = _experiment(tmp_path, synth, loc_extra=', vertical_radius = 1.0, vertical_coordinate = "lev"')
    before = restarts(tmp_path, N)
    assert main(["run", "--quiet", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "analysis.localization.vertical_coordinate" in err and "vertical coordinate 'lev' is neither" in err, err
    assert "member_0001.nc" in err
    for a, b in zip(restarts(tmp_path, N), before):
        assert np.array_equal(a, b)
    assert not (tmp_path / "exp" / "cycles").exists()


def test_the_good_files_pass_and_an_external_analysis_only_needs_them_to_exist(tmp_path: Path, synth: Path) -> None:
    cfg = load_experiment(_experiment(tmp_path / "builtin", synth))
    checks.check_observations(cfg, [1, 2, 3])
    ext = load_experiment(_experiment(tmp_path / "external", synth, external=True))
    _spoil(tmp_path / "external" / "obs" / "obs_003.nc", "value", 0, np.nan)
    checks.check_observations(ext, [1, 2, 3])  # the external program reads the files its own way


def test_a_truth_file_without_the_state_variable_stops_the_run_before_any_forecast(
        tmp_path: Path, synth: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``[verification] truth``: cycle 3's file lacks the state variable; named with the cycle and the key."""
    toml = _experiment(tmp_path, synth, obs_extra='\n[verification]\ntruth = "truth/t_{cycle}.nc"\n')
    (tmp_path / "truth").mkdir()
    for k in (1, 2, 3):
        shutil.copyfile(synth / "member_0001.nc", tmp_path / "truth" / f"t_{k}.nc")
    with netCDF4.Dataset(tmp_path / "truth" / "t_3.nc", "a") as ds:
        ds.renameVariable("soil_moisture", "sm")
    assert main(["run", "--quiet", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "the truth file of cycle 3" in err and "t_3.nc, variable 'soil_moisture'" in err, err
    assert "key 'verification.truth'" in err
    assert not (tmp_path / "exp" / "cycles").exists()


@pytest.mark.parametrize("obs_extra, variable, index, value, message", [
    ("", "value", 5, np.nan, "holds NaN or Inf at index 5"),
    (BILINEAR, "lat", 6, 89.99, r"observation 6 at \(.*, 89.99\) is outside the domain of state variable"),
])
def test_a_large_file_is_checked_part_by_part_naming_the_observation_by_its_index_in_the_file(
        tmp_path: Path, synth: Path, monkeypatch: pytest.MonkeyPatch,
        obs_extra: str, variable: str, index: int, value: float, message: str) -> None:
    cfg = load_experiment(_experiment(tmp_path, synth, obs_extra=obs_extra))
    monkeypatch.setattr(checks, "PREFLIGHT_PART", 4)
    sizes: list[int] = []

    def load(*args: Any, **kw: Any) -> ObsFile:  # records each part, then loads it as the check would
        sizes.append(kw["part"].size)
        return load_for_state(*args, **kw)
    monkeypatch.setattr(checks, "load_for_state", load)
    checks.check_observations(cfg, [1])
    n = _n_obs(tmp_path / "obs" / "obs_001.nc")
    assert sum(sizes) == n > 8 and max(sizes) == 4
    _spoil(tmp_path / "obs" / "obs_003.nc", variable, index, value)
    with pytest.raises(FileFormatError, match=message) as ei:
        checks.check_observations(cfg, [1, 2, 3])
    assert ei.value.variable == variable and "(observation file of cycle 3)" in str(ei.value)
