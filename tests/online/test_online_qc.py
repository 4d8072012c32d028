"""Online mode with quality control (issue 14): the server's analysis rejects planted gross errors and
the counts per kind reach the report."""

import netCDF4
import numpy as np

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.online.launch import OnlineExperiment
from enkflow.report import load_report


def test_online_qc_counts_reach_the_report(tmp_path):
    toml = prepare(tmp_path, DemoSettings(members=3, cycles=1, mode="online", runners=1), lambda m: None)
    toml.write_text(toml.read_text() + "\n[observations.qc]\ngross_sigma = 4.0\n")
    planted = np.array([1, 5, 9])
    with netCDF4.Dataset(tmp_path / "obs" / "obs_0001.nc", "a") as ds:
        ds["value"][planted] = ds["value"][planted] + 50 * ds["error_std"][planted]
    cfg = load_experiment(toml)
    OnlineExperiment(cfg).run()
    rep = load_report(cfg.expdir)
    diag = rep.cycles[0].diagnostics
    assert diag["qc_rejected"] == diag["qc_gross"] >= planted.size, diag
    assert sum(v for k, v in diag.items() if k.startswith("qc_rejected:")) == diag["qc_rejected"]
