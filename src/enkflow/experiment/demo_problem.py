"""The problem of ``enkflow demo``: a twin experiment on the tiny synthetic land problem (Zheng et al. 2020).

It synthesizes the members, runs the truth through the demo model to make one observation file per cycle,
writes the experiment TOML (offline, or online with the bundled runner) and scores the ensemble mean against
the truth. ``enkflow.apps.demo`` runs it; ``enkflow bench online`` times it.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import netCDF4
import numpy as np

from enkflow.config import METHOD_TABLES, AdaptiveTarget, Method
from enkflow.errors import InputError
from enkflow.experiment.directory import ExperimentDir
from enkflow.fsutil import atomic_output
from enkflow.models.demo_model import DemoModel, run_model
from enkflow.models.synthetic_land import sample_observations
from enkflow.models.synthetic_land_files import generate
from enkflow.obs import ObsSet
from enkflow.obs.obsfile import ObsFile, read_obs_file, write_obs_file


@dataclass(frozen=True)
class DemoSettings:
    """Demo parameters: ``length`` in hours; ``radius`` the localization half-width in km."""

    members: int = 8
    cycles: int = 3
    length: float = 6.0
    size: str = "tiny"
    obs_fraction: float = 0.3
    obs_std: float = 0.05
    radius: float = 1500.0
    inflation: float = 1.05
    workers: int | None = None
    seed: int = 0
    analysis_command: str | None = None
    mode: str = "offline"  # or "online": server and runners exchange states in memory
    runners: int = 2  # online: runner processes
    adaptive: str = "none"  # [analysis.inflation] adaptive, e.g. "miyoshi2011" (then on top of `inflation`)
    adaptive_target: AdaptiveTarget = AdaptiveTarget.PRIOR  # [analysis.inflation] adaptive_target
    method: Method = Method.LETKF  # [analysis] method (the localization radius where the method takes one)
    method_options: Mapping[str, float | bool] = field(default_factory=dict)  # its table, e.g. {"rs": 2.0}


def _state(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds["soil_moisture"][:], dtype=np.float64)


def _write_cycle_observations(truth: Path, path: Path, k: int, s: DemoSettings, attrs: dict[str, Any]) -> int:
    """Observe the truth restart ``truth`` at cycle ``k`` into the observation file ``path``; returns n_obs."""
    sampled = sample_observations(_state(truth), fraction=s.obs_fraction, std=s.obs_std, seed=s.seed + 1000 * k)
    with netCDF4.Dataset(truth) as ds:
        lon = np.asarray(ds["land_lon"][:])[sampled.state_index]
        lat = np.asarray(ds["land_lat"][:])[sampled.state_index]
    of = ObsFile(ObsSet(sampled.values, sampled.error_std**2, np.column_stack([lon, lat])), sampled.state_index,
                 {**attrs, "cycle": np.int64(k)})
    with atomic_output(path) as tmp:
        write_obs_file(tmp, of)
    return sampled.n_obs


def _truth_and_observations(directory: Path, s: DemoSettings, truth_path: Path, obs_path: Path) -> int:
    """The truth trajectory: the same model, started from the truth (``truth/truth_NNNN.nc``);
    observations of it at each cycle's end (``obs/obs_NNNN.nc``, the attributes of the problem's
    ``obs_path``). Returns the observations per file."""
    truth_dir = directory / "truth"
    obs_dir = directory / "obs"
    truth_dir.mkdir(exist_ok=True)
    obs_dir.mkdir(exist_ok=True)
    template = read_obs_file(obs_path)
    truth = truth_dir / "truth.nc"
    shutil.copyfile(truth_path, truth)
    shutil.copyfile(truth, truth_dir / "truth_0000.nc")
    n_obs = 0
    for k in range(1, s.cycles + 1):
        run_model(truth, DemoModel(length=s.length, start_hour=(k - 1) * s.length))
        shutil.copyfile(truth, truth_dir / f"truth_{k:04d}.nc")
        n_obs = _write_cycle_observations(truth, obs_dir / f"obs_{k:04d}.nc", k, s, template.attrs)
    return n_obs


def _analysis_section(s: DemoSettings) -> str:
    if s.analysis_command:
        return f'[analysis_task]\ncommand = "{s.analysis_command}"\n'
    table = {m: name for name, m in METHOD_TABLES.items()}.get(s.method)
    if s.method_options and table is None:
        raise InputError(f"method {s.method.value!r} takes no options", item="method_options")
    localization = (f'localization = {{ radius = {s.radius}, metric = "sphere" }}\n'
                    if s.method.needs_localization else "")
    target = f', adaptive_target = "{s.adaptive_target.value}"' if s.adaptive_target is not AdaptiveTarget.PRIOR else ""
    options = ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in s.method_options.items())
    options = f"{table} = {{ {options} }}\n" if options else ""
    return f'''[state]
variables = ["soil_moisture"]
coordinates = ["land_lon", "land_lat"]

[analysis]
method = "{s.method.value}"
{localization}inflation = {{ prior = {s.inflation}, adaptive = "{s.adaptive}"{target} }}
{options}
[analysis_output]
statistics = true     # forecast mean and increment too, for the report's maps (docs/output.md)
'''


def _online_section(s: DemoSettings) -> str:
    if s.mode not in ("offline", "online"):
        raise InputError(f"--mode must be 'offline' or 'online', not {s.mode!r}", item="mode")
    if s.mode == "online" and s.analysis_command:
        raise InputError("online mode runs the built-in analysis: --analysis-command is for offline mode", item="mode")
    if s.mode != "online":
        return ""
    return f'''
[online]
runner = "{sys.executable} -m enkflow.online.models demo --address {{address}} --token-file {{token_file}} --grid {{restart}} --length {{length}} --curve-key={{curve_key}}"
runners = {s.runners}
heartbeat = 0.5
heartbeat_timeout = 10.0
'''


def _experiment_toml(directory: Path, toml: Path, s: DemoSettings) -> str:
    """The text of ``toml``, the experiment file of the demo in ``directory``."""
    analysis = _analysis_section(s)
    workers = f"workers = {s.workers}\n" if s.workers else ""
    online = _online_section(s)
    return f'''# Written by `enkflow demo`; rerun with `enkflow run {toml}` (it resumes), see docs/jobs.md.
# The run directory (events, cycles) is run/ next to this file: `enkflow report {directory / 'run'}`.
[experiment]
directory = "run"
cycles = {s.cycles}
members = {s.members}
restart = "members/member_{{member:04d}}.nc"
forecast_length = {s.length}
mode = "{s.mode}"

[model]
command = "{sys.executable} -m enkflow.cli.model {{restart}} --length {{length}} --cycle {{cycle}}"

[observations]
file = "obs/obs_{{cycle:04d}}.nc"

[verification]
truth = "truth/truth_{{cycle:04d}}.nc"   # the analysis's RMSE and the report's scores (docs/configuration.md)

{analysis}
[jobs]
strategy = "dynamic"
{workers}poll = 0.1

[launcher]
kind = "local"
{online}'''


def prepare(directory: Path, s: DemoSettings, say: Callable[[str], None]) -> Path:
    """Write the problem, the observations of every cycle and ``experiment.toml``; returns its path."""
    if s.members < 2 or s.cycles < 1:
        raise InputError("the demo needs at least 2 members and 1 cycle", item="members")
    t0 = time.perf_counter()
    r = generate(directory / "members", size=s.size, members=s.members, seed=s.seed, obs_fraction=s.obs_fraction,
                 obs_std=s.obs_std, overwrite=True)
    say(f"synthesized '{s.size}' land problem: {r.n_land} land points, {s.members} members ({time.perf_counter() - t0:.1f} s)")
    n_obs = _truth_and_observations(directory, s, r.truth_path, r.obs_path)
    say(f"truth run and {s.cycles} observation files of {n_obs} observations written")
    toml = directory / "experiment.toml"
    toml.write_text(_experiment_toml(directory, toml, s))
    return toml


def rmse_against_truth(directory: Path, members: int, cycle: int, run: ExperimentDir | None = None) -> tuple[float, float]:
    """(RMSE of the ensemble mean against the truth of ``cycle``, ensemble spread sqrt(mean variance)), field units.

    Cycle 0 from the member files; later cycles from the analysis mean and spread that both
    modes write (``RUN/cycles/NNNN/analysis_{mean,spread}.nc``), so both are scored identically.
    """
    t = _state(directory / "truth" / f"truth_{cycle:04d}.nc")
    if cycle == 0 or run is None:
        X = np.stack([_state(directory / "members" / f"member_{m:04d}.nc") for m in range(1, members + 1)], axis=1)
        mean, var = X.mean(axis=1), X.var(axis=1, ddof=1)
    else:
        cdir = run.cycle(cycle)
        mean, var = _state(cdir.mean), _state(cdir.spread) ** 2
    return float(np.sqrt(np.mean((mean - t) ** 2))), float(np.sqrt(np.mean(var)))


