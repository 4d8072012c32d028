"""Building small offline experiments for the job-scheme tests."""

from __future__ import annotations

import sys
from pathlib import Path

import netCDF4
import numpy as np
from enkflow_testing.experiments import stage_inputs

HERE = Path(__file__).parent
TOY_ANALYSIS = HERE / "toy_analysis.py"

_SYNTH_CACHE: dict[int, Path] = {}


def synth_members(tmp_root: Path, members: int) -> Path:
    """A tiny synthetic land problem with ``members`` members (generated once per session)."""
    from enkflow.models.synthetic_land_files import generate

    if members not in _SYNTH_CACHE:
        out = tmp_root / f"synth{members}"
        generate(out, size="tiny", members=members, overwrite=True)
        _SYNTH_CACHE[members] = out
    return _SYNTH_CACHE[members]


def make_experiment(root: Path, synth: Path, *, members: int = 4, cycles: int = 3, workers: int = 2,
                    model_sleep: float = 0.2, analysis_sleep: float = 0.0, strategy: str = "dynamic",
                    launcher: str = "local", extra: str = "", model_command: str | None = None,
                    max_attempts: int = 3, obs_cycles: int | None = None, time_limit: float = 600.0,
                    launcher_cpus: int = 0, model_extra: str = "", pilots: str = "study",
                    jobs_extra: str = "") -> Path:
    """Copy the member restarts to ``root/members`` and write ``root/exp.toml``; returns its path."""
    stage_inputs(root, synth, members=members, cycles=cycles if obs_cycles is None else obs_cycles)
    py = sys.executable
    model = model_command or f"{py} -m enkflow.cli.model {{restart}} --length {{length}} --cycle {{cycle}} --sleep {model_sleep}"
    analysis = f"{py} {TOY_ANALYSIS} {{config}} {{cycle}} --sleep {analysis_sleep}"
    text = f'''
[experiment]
directory = "exp"
cycles = {cycles}
members = {members}
restart = "members/member_{{member:04d}}.nc"
forecast_length = 6

[model]
command = "{model}"
max_attempts = {max_attempts}
{model_extra}

[observations]
file = "obs/obs_{{cycle:03d}}.nc"

[analysis_task]
command = "{analysis}"
max_attempts = {max_attempts}

[jobs]
strategy = "{strategy}"
workers = {workers}
time_limit = {time_limit}
pilots = "{pilots}"
{jobs_extra}
poll = 0.1
heartbeat = 0.5
lease = 5.0

[launcher]
kind = "{launcher}"
cpus = {launcher_cpus}
{extra}
'''
    (root / "exp.toml").write_text(text)
    return root / "exp.toml"


def restarts(root: Path, members: int) -> list[np.ndarray]:
    """The state of every member restart under ``root/members``.

    Each file is closed here: an unclosed Dataset sits in a reference cycle and
    would be closed by the garbage collector in whichever thread runs it, i.e.
    concurrently with NetCDF calls in another thread (not thread-safe: seen as
    a segfault when the fault tests' killer thread collected one).
    """
    out = []
    for m in range(1, members + 1):
        with netCDF4.Dataset(root / "members" / f"member_{m:04d}.nc") as ds:
            out.append(np.asarray(ds["soil_moisture"][:]))
    return out
