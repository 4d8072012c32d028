"""Online mode through a real SLURM: the server and the runners are batch jobs; the result is the
same as on the local launcher, bit for bit."""

import netCDF4
import numpy as np
import pytest

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.jobs.events import iter_events
from enkflow.online.launch import OnlineExperiment

pytestmark = pytest.mark.slurm


def _members(d, n):
    out = []
    for m in range(1, n + 1):
        with netCDF4.Dataset(d / "members" / f"member_{m:04d}.nc") as ds:
            out.append(np.asarray(ds["soil_moisture"][:]))
    return out


def test_online_study_on_slurm(slurm, tmp_path):
    local = prepare(tmp_path / "local", DemoSettings(members=4, cycles=2, mode="online", runners=2), lambda m: None)
    OnlineExperiment(load_experiment(local)).run()
    toml = prepare(tmp_path / "slurm", DemoSettings(members=4, cycles=2, mode="online", runners=2), lambda m: None)
    toml.write_text(toml.read_text().replace('[launcher]\nkind = "local"', '[launcher]\nkind = "slurm"'))
    cfg = load_experiment(toml)
    assert cfg.launcher.kind == "slurm"
    OnlineExperiment(cfg).run()
    for a, b in zip(_members(tmp_path / "local", 4), _members(tmp_path / "slurm", 4)):
        assert np.array_equal(a, b)
    ev = list(iter_events(cfg.expdir / "events.jsonl"))
    jobs = [e["job"] for e in ev if e["event"] in ("server_start", "runner_start")]
    assert len(jobs) >= 3 and all(str(j).isdigit() for j in jobs)  # real SLURM job IDs
