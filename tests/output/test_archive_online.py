"""Background archiving of an online study (server and runner processes): every cycle's analysis checkpoint is
archived, and `enkflow run --from-archive CYCLE` resumes the server from it with the same next cycle, bitwise.
The same study's runners write their forecasts through the output service: one dataset per field."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.jobs.events import iter_events
from enkflow.online.launch import OnlineExperiment
from enkflow.output import archive as A

from demo_runner_with_output import with_model_output

N = 4


def _members(d: Path) -> list[bytes]:
    return [(d / "members" / f"member_{m:04d}.nc").read_bytes() for m in range(1, N + 1)]


@pytest.mark.parametrize("ranks", [1, 2])
def test_online_archive_and_restart_from_it_bitwise(tmp_path: Path, ranks: int, mpiexec: str) -> None:
    d = tmp_path / "study"
    d.mkdir()
    toml = prepare(d, DemoSettings(members=N, cycles=3, mode="online", runners=2), lambda m: None)
    initial = {m: (d / "members" / f"member_{m:04d}.nc").read_bytes() for m in range(1, N + 1)}
    text = toml.read_text()
    if ranks > 1:  # one checkpoint per server rank, all archived together
        text = text.replace("runners = 2", f'runners = 2\nranks = {ranks}\nmpiexec = "{mpiexec}"')
    toml.write_text(text + '\n[archive]\ndir = "backup"\nkeep_last = 0\n')
    n_land = with_model_output(toml, N) if ranks == 1 else 0
    status = OnlineExperiment(load_experiment(toml)).run()
    assert status["state"] == "done"
    final = _members(d)
    if n_land:
        forecasts = _model_output(d, n_land)
    assert A.listed_cycles(d / "backup") == [1, 2, 3]
    assert sorted(f["target"] for f in A.verify(d / "backup", 2)["files"]) == [f"rank:{r}" for r in range(ranks)]

    run = tmp_path / "again"
    shutil.copytree(d, run, symlinks=True)
    for m, data in initial.items():  # only the restored checkpoint can give the final state
        (run / "members" / f"member_{m:04d}.nc").write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "enkflow", "run", str(run / "experiment.toml"), "--from-archive", "2",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _members(run) == final
    ev = list(iter_events(run / "run" / "events.jsonl"))
    i = [k for k, e in enumerate(ev) if e["event"] == "archive_restore"]
    assert len(i) == 1 and ev[i[0]]["cycle"] == 2
    assert [e["cycle"] for e in ev[i[0]:] if e["event"] == "online_cycle_end"] == [3]
    assert A.verify(run / "backup", 3)
    if n_land:  # the resumed study wrote cycle 3's forecasts again, in place, into the file it found
        assert np.array_equal(_model_output(run, n_land), forecasts)


def _model_output(d: Path, n_land: int) -> np.ndarray:
    """The runners' forecasts as xarray (no dask) opens their one file: (cycle, member, point), mean beside."""
    xr = pytest.importorskip("xarray")
    assert sorted(p.name for p in (d / "model_output").glob("*.nc")) == ["soil_moisture.nc"]
    with xr.open_dataset(d / "model_output" / "soil_moisture.nc", decode_times=False) as ds:
        assert ds["soil_moisture"].dims == ("time", "member", "point")
        assert ds["soil_moisture"].shape == (3, N, n_land) and list(ds["member"].values) == list(range(1, N + 1))
        assert list(ds["time"].values) == [1.0, 2.0, 3.0] and "realization" not in ds.variables
        x = ds["soil_moisture"].values
        assert np.isfinite(x).all() and not np.array_equal(x[0], x[1])
        np.testing.assert_allclose(ds["soil_moisture_mean"].values, x.mean(axis=1), rtol=0, atol=1e-14)
        np.testing.assert_allclose(ds["soil_moisture_spread"].values, x.std(axis=1, ddof=1), rtol=1e-12, atol=1e-15)
    return x


def test_online_archive_failure_stops_the_study_when_configured(tmp_path: Path) -> None:
    from enkflow.errors import EnkflowError

    d = tmp_path / "study"
    d.mkdir()
    toml = prepare(d, DemoSettings(members=N, cycles=2, mode="online", runners=2), lambda m: None)
    (d / "blocker").write_text("a file where the archive directory should be")
    toml.write_text(toml.read_text() + '\n[archive]\ndir = "blocker/backup"\non_failure = "stop"\n')
    with pytest.raises(EnkflowError, match="the server stopped: archiving of cycle"):
        OnlineExperiment(load_experiment(toml)).run()
    ev = list(iter_events(d / "run" / "events.jsonl"))
    assert [e["event"] for e in ev if e["event"] == "archive_fail"] == ["archive_fail"]
    assert not [e for e in ev if e["event"] == "server_crash"]  # a deterministic failure: not retried
    assert A.staged_cycles(d / "run" / "archive" / "staging")  # left for the next run
