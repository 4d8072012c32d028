"""Reading an experiment's cycle directories for the report page: the state variables, a variable as
float64 with fill values as NaN, and the longitude and latitude of its points."""

from __future__ import annotations

import json
from pathlib import Path

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


def state_variables(expdir: Path) -> list[str] | None:
    """The state variables the experiment's ``config.json`` names; None where it names none or cannot be read."""
    try:
        cfg = json.loads(ExperimentDir(expdir).config.read_text())
        return list((cfg.get("state") or {}).get("variables") or []) or None
    except (OSError, ValueError):
        return None


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


def lonlat(path: Path, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Longitude and latitude of every point of ``name`` (its shape), from its CF coordinates."""
    with netCDF4.Dataset(path) as ds:
        v = ds.variables[name]
        cands = str(getattr(v, "coordinates", "")).split() + list(v.dimensions)
        lon = lat = None
        for c in cands:
            if c not in ds.variables:
                continue
            cv = ds.variables[c]
            sn, un = str(getattr(cv, "standard_name", "")), str(getattr(cv, "units", ""))
            if sn == "longitude" or un.startswith("degrees_e") or (lon is None and "lon" in c.lower()):
                lon = c
            elif sn == "latitude" or un.startswith("degrees_n") or (lat is None and "lat" in c.lower()):
                lat = c
        if lon is None or lat is None:
            return None
        lo, la = np.asarray(ds.variables[lon][:], float), np.asarray(ds.variables[lat][:], float)
        if lo.shape == v.shape and la.shape == v.shape:
            return lo, la
        if lo.ndim == 1 and la.ndim == 1 and v.ndim >= 2 and v.shape[-2:] == (la.size, lo.size):
            LO, LA = np.meshgrid(lo, la)
            return np.broadcast_to(LO, v.shape), np.broadcast_to(LA, v.shape)
        return None
