"""Small offline experiments with enkflow's built-in analysis, for fault trials and benchmarks.

The job-scheme tests have their own helpers (``tests/jobs_helpers``, with a toy
external analysis); these build the same tiny synthetic land problem but run
the *built-in* analysis task (``[state]`` + ``[analysis]``: LETKF through the
crash-safe in-place update), which is what the fault trials exercise.
Importable by benchmarks (which put ``testing/`` on ``sys.path``) as well as by
tests; nothing here imports a test module.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

STATE_VARIABLE = "soil_moisture"


def synth_problem(directory: str | Path, members: int = 4, *, seed: int = 0) -> Path:
    """The 'tiny' synthetic land problem (72x36 grid, 877 land points) with ``members`` members in
    ``directory`` (``member_NNNN.nc``, ``obs.nc``); generated once, reused when complete."""
    d = Path(directory)
    stamp = d / ".complete"
    if stamp.exists() and stamp.read_text() == f"{members} {seed}":
        return d
    from enkflow.models.synthetic_land_files import generate

    generate(d, size="tiny", members=members, seed=seed, overwrite=True)
    stamp.write_text(f"{members} {seed}")
    return d


def stage_inputs(root: str | Path, synth: str | Path, *, members: int, cycles: int, copy_members: bool = True) -> None:
    """Lay out an experiment's inputs under ``root`` from a synthetic problem: the member restarts as
    ``members/member_NNNN.nc`` (unless ``copy_members`` is False: a continued experiment keeps its
    advanced restarts) and one observation file per cycle, ``obs/obs_KKK.nc``."""
    root, synth = Path(root), Path(synth)
    (root / "members").mkdir(parents=True, exist_ok=True)
    (root / "obs").mkdir(exist_ok=True)
    if copy_members:
        for m in range(1, members + 1):
            shutil.copyfile(synth / f"member_{m:04d}.nc", root / "members" / f"member_{m:04d}.nc")
    for k in range(1, cycles + 1):
        shutil.copyfile(synth / "obs.nc", root / "obs" / f"obs_{k:03d}.nc")


def _toml_str(s: str) -> str:
    """A TOML basic string (JSON's escaping is valid TOML for these characters)."""
    return json.dumps(s)


def write_builtin_experiment(
    root: str | Path,
    synth: str | Path,
    *,
    members: int = 4,
    cycles: int = 2,
    workers: int = 2,
    analysis_launcher: str = "",
    max_attempts: int = 3,
    model_sleep: float = 0.0,
    python: str | None = None,
    extra: str = "",
) -> Path:
    """Copy the members and one observation file per cycle under ``root`` and write
    ``root/exp.toml`` (experiment directory ``root/exp``); returns the TOML's path.

    The analysis is the built-in LETKF (no ``analysis_task.command``), so it runs
    ``[analysis_task.launcher] python -m enkflow.experiment.analysis_task EXPDIR CYCLE`` and
    updates the restarts in place through the write-ahead log. ``analysis_launcher`` is that
    prefix (e.g. a fault injector). Jobs poll fast (0.1 s) so that trials are short.
    """
    root = Path(root)
    stage_inputs(root, synth, members=members, cycles=cycles)
    py = python or sys.executable
    model = f"{py} -m enkflow.cli.model {{restart}} --length {{length}} --cycle {{cycle}}"
    if model_sleep:
        model += f" --sleep {model_sleep}"
    text = f"""# Written by enkflow_testing.experiments.write_builtin_experiment
[experiment]
directory = "exp"
cycles = {cycles}
members = {members}
restart = "members/member_{{member:04d}}.nc"
forecast_length = 6

[model]
command = {_toml_str(model)}
max_attempts = {max_attempts}

[observations]
file = "obs/obs_{{cycle:03d}}.nc"

[state]
variables = ["{STATE_VARIABLE}"]
coordinates = ["land_lon", "land_lat"]

[analysis]
method = "letkf"
localization = {{ radius = 1500.0, metric = "sphere" }}
inflation = {{ prior = 1.05 }}

[analysis_task]
launcher = {_toml_str(analysis_launcher)}
max_attempts = {max_attempts}

[jobs]
strategy = "dynamic"
workers = {workers}
poll = 0.1
heartbeat = 0.5
lease = 5.0

[launcher]
kind = "local"
{extra}
"""
    toml = root / "exp.toml"
    toml.write_text(text)
    return toml


def restart_paths(root: str | Path, members: int) -> list[Path]:
    """The member restarts of an experiment written by :func:`write_builtin_experiment`."""
    return [Path(root) / "members" / f"member_{m:04d}.nc" for m in range(1, members + 1)]


def restart_bytes(root: str | Path, members: int) -> list[bytes]:
    """Every byte of every member restart (the files are small: a whole-file comparison is the
    strictest one, and what "bitwise equal" means in the fault trials)."""
    return [p.read_bytes() for p in restart_paths(root, members)]
