"""The bundled demo model (``enkflow model``): advection-diffusion with forcing on the land points.

It reads one NetCDF restart of the synthetic land problem (or any file with
a state variable on a ``land`` dimension and 0-based grid indices
``land_i``/``land_j`` into ``lon``/``lat``), advances the state
``n_steps = round(length / dt)`` steps of ``dt = 1`` hour and writes the
restart back **atomically**: the new content goes to a temporary copy in the
same directory, which is flushed and renamed over the original, so a kill at
any moment leaves either the old or the new restart, never a half-written one.

One step on the ``(n_y, n_x)`` grid, ocean cells excluded::

    u += dt * ( -c (u - u_west) / 1            upwind advection eastwards, periodic in longitude
                + kappa * sum_nb (u_nb - u)     diffusion, no flux across coasts
                + a * sin(omega t) * f(i, j) )  zero-mean forcing, the same for every member

with ``c = 0.2`` cells/h, ``kappa = 0.05`` /h, ``a = 0.01`` /h, ``omega = 2 pi / 24`` h^-1 and
``f`` the truth pattern of the synthetic problem. A land point whose western
neighbour is ocean sees no advective inflow. There is no relaxation: member
differences persist, so only assimilation reduces the error (twin experiments).
The model is deterministic: the same restart, cycle and length give the same bits.

Cost: ``substeps`` divides each hour into that many smaller steps (more real
computation); ``sleep`` adds idle seconds, which emulates a larger model on a
machine with fewer cores than the emulated cluster.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.errors import FileFormatError, InputError
from enkflow.fsutil import atomic_output
from enkflow.models.synthetic_land import LonLatGrid, member_field

DT_HOURS = 1.0
ADVECTION = 0.2  # cells per hour, eastwards
DIFFUSION = 0.05  # per hour
FORCING = 0.01  # field units per hour
PERIOD_HOURS = 24.0


@dataclass(frozen=True)
class DemoModel:
    """Parameters of one run; ``length`` in hours, ``sleep`` in seconds."""

    length: float
    start_hour: float = 0.0
    substeps: int = 1
    sleep: float = 0.0
    variable: str = "soil_moisture"

    def __post_init__(self) -> None:
        if not self.length > 0 or not math.isfinite(self.length):
            raise InputError(f"forecast length must be > 0 hours, got {self.length!r}", item="length")
        if self.substeps < 1:
            raise InputError(f"substeps must be >= 1, got {self.substeps}", item="substeps")
        if self.sleep < 0:
            raise InputError(f"sleep must be >= 0 s, got {self.sleep}", item="sleep")

    def advance(self, u: np.ndarray, land: np.ndarray, pattern: np.ndarray,
                on_step: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
        """Advance the gridded field ``u`` ((n_y, n_x), NaN-free) on the cells where ``land`` is True.

        ``on_step(k, u)``, if given, is called after each step of ``dt`` hours (k = 1, 2, ...) with the
        field at that time: the hook that writes model output (``enkflow bench output``)."""
        n_steps = max(1, int(round(self.length / DT_HOURS)))
        dt = DT_HOURS / self.substeps
        u = np.where(land, u, 0.0)
        west_land = np.roll(land, 1, axis=1)
        nb = [(np.roll(land, s, axis=a), s, a) for a, s in ((0, 1), (0, -1), (1, 1), (1, -1))]
        # Rolls along latitude wrap the poles onto each other; those neighbours are excluded.
        nb_masks = []
        for m, s, a in nb:
            mm = m & land
            if a == 0:
                mm = mm.copy()
                mm[0 if s == 1 else -1, :] = False
            nb_masks.append((mm, s, a))
        for k in range(n_steps * self.substeps):
            t = self.start_hour + k * dt
            u_west = np.where(west_land, np.roll(u, 1, axis=1), u)
            tend = -ADVECTION * (u - u_west)
            for mm, s, a in nb_masks:
                tend += DIFFUSION * np.where(mm, np.roll(u, s, axis=a) - u, 0.0)
            tend += FORCING * math.sin(2.0 * math.pi * t / PERIOD_HOURS) * pattern
            u = np.where(land, u + dt * tend, 0.0)
            if on_step is not None and (k + 1) % self.substeps == 0:
                on_step((k + 1) // self.substeps, u)
        return u


def _pattern(n_x: int, n_y: int) -> np.ndarray:
    g = LonLatGrid(n_x, n_y)
    jj, ii = np.meshgrid(np.arange(n_y), np.arange(n_x), indexing="ij")
    return member_field(g, ii, jj, 0.0)


def run_model(restart: str | os.PathLike[str], model: DemoModel, *, output: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """Advance ``restart`` by ``model.length`` hours; write it back atomically (or to ``output``).

    Returns the timings in seconds: ``read_s``, ``compute_s``, ``write_s``, ``sleep_s``.
    """
    src = Path(restart)
    t0 = time.perf_counter()
    try:
        with netCDF4.Dataset(src, "r") as ds:
            for name in (model.variable, "land_i", "land_j"):
                if name not in ds.variables:
                    raise FileFormatError("variable missing (the demo model needs the state and land_i/land_j)", path=str(src), variable=name)
            n_x = len(ds.dimensions["lon"])
            n_y = len(ds.dimensions["lat"])
            x = np.asarray(ds.variables[model.variable][:], dtype=np.float64)
            i = np.asarray(ds.variables["land_i"][:], dtype=np.int64)
            j = np.asarray(ds.variables["land_j"][:], dtype=np.int64)
    except (OSError, KeyError) as exc:
        raise FileFormatError(f"cannot read restart: {exc}", path=str(src)) from None
    if not np.all(np.isfinite(x)):
        raise FileFormatError("state holds NaN or Inf", path=str(src), variable=model.variable)
    t1 = time.perf_counter()
    land = np.zeros((n_y, n_x), dtype=bool)
    land[j, i] = True
    u = np.zeros((n_y, n_x))
    u[j, i] = x
    u = model.advance(u, land, _pattern(n_x, n_y))
    x_new = u[j, i]
    t2 = time.perf_counter()
    if model.sleep:
        time.sleep(model.sleep)
    t3 = time.perf_counter()
    with atomic_output(Path(output) if output is not None else src) as tmp:
        shutil.copyfile(src, tmp)
        with netCDF4.Dataset(tmp, "r+") as ds:
            ds.variables[model.variable][:] = x_new
    t4 = time.perf_counter()
    return {"read_s": t1 - t0, "compute_s": t2 - t1, "sleep_s": t3 - t2, "write_s": t4 - t3}


def write_timings(timings: dict[str, float]) -> None:
    """Write ``timings`` to ``$ENKFLOW_TIMING_FILE`` when the worker asked for it."""
    path = os.environ.get("ENKFLOW_TIMING_FILE")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(timings, fh)
        os.replace(tmp, path)
