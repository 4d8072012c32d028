"""Online and offline run the one analysis step (enkflow.experiment.step.build_step): what offline
writes, online writes. This failed while the server assembled its own analysis: it named the
observation-space diagnostics' coordinates coord_1/coord_2 for a global filter on lon/lat
observations, where offline writes lon/lat (the balance report of one server rank, the other drift
of those days, is checked in test_online_modes.py)."""

from pathlib import Path

import netCDF4
import numpy as np

from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.experiment.driver import Experiment
from enkflow.online.launch import OnlineExperiment


def _run(d: Path, mode: str) -> Path:
    """A one-cycle demo study with a global filter in ``d`` (3 members; online: one runner); its run directory."""
    toml = prepare(d, DemoSettings(members=3, cycles=1, mode=mode, runners=1), lambda _m: None)
    text = toml.read_text()
    start = text.index('method = "letkf"')
    end = text.index("\n", text.index("localization =", start))
    toml.write_text(text[:start] + 'method = "etkf"' + text[end:])
    cfg = load_experiment(toml)
    (OnlineExperiment(cfg) if mode == "online" else Experiment(cfg)).run()
    return cfg.expdir


def _obs_diag(expdir: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(expdir / "cycles" / "0001" / "obs_diag.nc") as ds:
        ds.set_auto_mask(False)
        return {k: np.asarray(v[:]) for k, v in ds.variables.items()}


def test_global_filter_names_lonlat_diagnostics_coordinates_as_offline(tmp_path):
    offline = _obs_diag(_run(tmp_path / "offline", "offline"))
    online = _obs_diag(_run(tmp_path / "online", "online"))
    assert {"lon", "lat"} <= offline.keys() and not any(k.startswith("coord_") for k in offline)
    assert online.keys() == offline.keys()
    for k, v in offline.items():
        np.testing.assert_array_equal(online[k], v, err_msg=k)
