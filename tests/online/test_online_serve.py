"""`enkflow serve`: the server alone, with runners started by hand; and `enkflow run` in online mode
refuses bad configurations before anything starts."""

import subprocess
import sys
import time

import netCDF4
import numpy as np
import pytest

from enkflow.errors import ConfigError, FileFormatError
from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.online.launch import OnlineExperiment


def _state(path):
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds["soil_moisture"][:])


def test_serve_with_runners_started_by_hand(tmp_path, subprocess_env):
    toml = prepare(tmp_path, DemoSettings(members=4, cycles=2, mode="online"), lambda m: None)
    toml.write_text(toml.read_text().replace("[online]\n", "[online]\nmin_runners = 2\n"))
    before = _state(tmp_path / "members" / "member_0001.nc")
    server = subprocess.Popen([sys.executable, "-m", "enkflow", "serve", str(toml)], env=subprocess_env,
                              stderr=subprocess.PIPE, text=True)
    address = tmp_path / "run" / "online" / "address"
    deadline = time.monotonic() + 60
    while not address.exists():
        assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
        time.sleep(0.05)
    argv = [sys.executable, "-m", "enkflow.online.models", "demo", "--address", address.read_text().strip(),
            "--token-file", str(tmp_path / "run" / "online" / "token"), "--grid", str(tmp_path / "members" / "member_0001.nc")]
    runners = [subprocess.Popen(argv, env=subprocess_env) for _ in range(2)]
    _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err
    assert "cycle 2: analysis done" in err
    for r in runners:
        assert r.wait(timeout=30) == 0
    after = _state(tmp_path / "members" / "member_0001.nc")
    assert not np.array_equal(before, after)  # the final analysis went back into the restarts


def test_online_run_checks_before_starting_anything(tmp_path):
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=2, mode="online"), lambda m: None)
    (tmp_path / "obs" / "obs_0002.nc").write_bytes(b"garbage")
    with pytest.raises(FileFormatError, match="obs_0002"):
        OnlineExperiment(load_experiment(toml)).run()
    assert not (tmp_path / "run" / "online" / "address").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text(toml.read_text().replace(f'runner = "{sys.executable}', 'runner = "/nonexistent/python'))
    with pytest.raises(ConfigError, match="online.runner"):
        OnlineExperiment(load_experiment(bad)).run()


def test_initial_copy_leaves_the_initial_ensemble_untouched(tmp_path):
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online", runners=1), lambda m: None)
    toml.write_text(toml.read_text().replace('mode = "online"', 'mode = "online"\ninitial = "copy"'))
    before = _state(tmp_path / "members" / "member_0002.nc")
    OnlineExperiment(load_experiment(toml)).run()
    assert np.array_equal(before, _state(tmp_path / "members" / "member_0002.nc"))
    copy = tmp_path / "run" / "restarts" / "0002" / "member_0002.nc"
    assert not np.array_equal(before, _state(copy))


def test_offline_only_settings_are_refused_in_online_mode(tmp_path):
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online"), lambda m: None)
    bad = tmp_path / "bad.toml"
    bad.write_text(toml.read_text() + '\n[analysis_task]\ncommand = "true"\n')
    with pytest.raises(ConfigError, match="analysis_task.command is for offline mode"):
        load_experiment(bad)
