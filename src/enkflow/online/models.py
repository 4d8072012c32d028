"""The bundled models as online runners: ``python -m enkflow.online.models {demo,l96} ...``.

Each is the model's own time stepping around the runner loop of
:class:`~enkflow.online.runner.Runner`, with the same arithmetic as its
offline counterpart (``enkflow model`` and ``enkflow l96``), so both modes
give the same bits. A model error is reported to the server (:meth:`Runner.fail`)
before the process exits with status 1. ``--sleep S`` adds S idle seconds to every
forecast (an emulated model cost, as ``enkflow model --sleep``). SIGTERM (a
cancelled job, a batch system's warning before its kill) makes the runner leave
cleanly: it says BYE, so the server gives the member it holds to another runner
at once instead of waiting for its heartbeats to stop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.models import lorenz96 as l96
from enkflow.models.demo_model import DT_HOURS, DemoModel, _pattern
from enkflow.online.fields import Field
from enkflow.online.runner import Runner, run_runner_process


def demo_runner(runner: Runner, grid: Path, length: float, variable: str = "soil_moisture", sleep: float = 0.0) -> int:
    """The demo model: ``grid`` a restart of the problem (for the land points), ``length`` hours per cycle,
    ``sleep`` idle seconds per forecast."""
    with netCDF4.Dataset(grid) as ds:
        n_x, n_y = len(ds.dimensions["lon"]), len(ds.dimensions["lat"])
        i = np.asarray(ds.variables["land_i"][:], dtype=np.int64)
        j = np.asarray(ds.variables["land_j"][:], dtype=np.int64)
        dtype = np.dtype(ds.variables[variable].dtype).name
    land = np.zeros((n_y, n_x), dtype=bool)
    land[j, i] = True
    pattern = _pattern(n_x, n_y)
    runner.init([Field(variable, dtype, (i.size,))])
    x = np.zeros(i.size, dtype=dtype)
    x, nsteps = runner.expose(x)
    while nsteps:
        model = DemoModel(length=nsteps * DT_HOURS, start_hour=(runner.cycle - 1) * length, variable=variable, sleep=sleep)
        u = np.zeros((n_y, n_x))
        u[j, i] = x
        x[...] = model.advance(u, land, pattern)[j, i]
        if sleep:
            time.sleep(sleep)
        x, nsteps = runner.expose(x)
    return 0


def l96_runner(runner: Runner, sleep: float = 0.0) -> int:
    """Lorenz-96 (40 variables, RK4): ``nsteps`` steps of dt = 0.05 per cycle, ``sleep`` idle seconds per forecast."""
    runner.init([Field("x", "float64", (l96.N_VARS,))])
    x = np.zeros(l96.N_VARS)
    x, nsteps = runner.expose(x)
    while nsteps:
        y = x
        for _ in range(nsteps):
            y = l96.step(y)
        x[...] = y
        if sleep:
            time.sleep(sleep)
        x, nsteps = runner.expose(x)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enkflow.online.models", description=__doc__)
    p.add_argument("model", choices=["demo", "l96"])
    p.add_argument("--address", required=True, help="the server's control address, tcp://HOST:PORT")
    p.add_argument("--token-file", required=True, help="file holding the shared token")
    p.add_argument("--curve-key", default="", help="the server's CURVE public key (Z85), when it encrypts")
    p.add_argument("--grid", default=None, help="demo: a restart file of the problem (land points)")
    p.add_argument("--length", type=float, default=6.0, help="demo: hours per cycle (for the forcing's phase)")
    p.add_argument("--sleep", type=float, default=0.0, metavar="S", help="extra idle seconds per forecast (emulated cost)")
    args = p.parse_args(argv)
    if args.sleep < 0:
        p.error(f"--sleep must be >= 0, got {args.sleep}")
    if args.model == "demo" and not args.grid:
        p.error("the demo runner needs --grid")
    token = Path(args.token_file).read_text().strip()
    runner = Runner(args.address, token, curve_server_key=args.curve_key or None)

    def body() -> int:
        if args.model == "demo":
            return demo_runner(runner, Path(args.grid), args.length, sleep=args.sleep)
        return l96_runner(runner, sleep=args.sleep)

    return run_runner_process(runner, body, name="enkflow runner")


if __name__ == "__main__":
    sys.exit(main())
