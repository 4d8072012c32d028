"""Reading an experiment's cycle directories for the report page: the state variables, a variable as
float64 with fill values as NaN."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.experiment.directory import CycleDir, ExperimentDir


def cycle_dirs(expdir: Path) -> list[tuple[int, CycleDir]]:
    """``(cycle, directory)`` of ``EXPDIR/cycles/NNNN``, in cycle order."""
    out = []
    for p in sorted(ExperimentDir(expdir).cycles.glob("[0-9]*")):
        if p.is_dir() and p.name.isdigit():
            out.append((int(p.name), CycleDir(p)))
    return out


def run_config(expdir: Path) -> dict[str, Any]:
    """The run's ``config.json`` (the resolved experiment TOML); empty where it cannot be read."""
    try:
        cfg = json.loads(ExperimentDir(expdir).config.read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def state_variables(expdir: Path) -> list[str] | None:
    """The state variables the experiment's ``config.json`` names; None where it names none or cannot be read."""
    return list((run_config(expdir).get("state") or {}).get("variables") or []) or None


def state_coordinates(expdir: Path) -> list[str] | None:
    """The run's ``[state] coordinates`` (horizontal first), None where it names none."""
    return list((run_config(expdir).get("state") or {}).get("coordinates") or []) or None


def mean_variables(path: Path, names: list[str] | None) -> list[str]:
    """The state variables of a mean/spread file: ``names`` where given, else those with a ``member:`` cell method."""
    with netCDF4.Dataset(path) as ds:
        if names:
            return [n for n in names if n in ds.variables]
        return [n for n, v in ds.variables.items() if str(getattr(v, "cell_methods", "")).startswith("member:")]


def read_float(path: Path, name: str) -> np.ndarray:
    """A variable as float64 with fill values as NaN."""
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        v.set_auto_maskandscale(True)
        a = v[...]
        return np.ma.filled(np.ma.asarray(a, dtype=np.float64), np.nan)


def has_variable(path: Path, name: str) -> bool:
    with netCDF4.Dataset(path) as ds:
        return name in ds.variables
