"""``enkflow model RESTART --length HOURS``: the bundled demo model.

Advances the state of one restart file of the synthetic land problem by
advection-diffusion with forcing and writes it back atomically. See
:mod:`enkflow.models.demo_model`.
"""

from __future__ import annotations

import argparse

from enkflow.cli import COMMANDS
from enkflow.models.demo_model import DemoModel, run_model, write_timings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help=COMMANDS["model"], description=__doc__)
    p.add_argument("restart", help="NetCDF restart to advance (replaced atomically unless --output is given)")
    p.add_argument("--length", type=float, required=True, metavar="HOURS", help="forecast length in hours")
    p.add_argument("--cycle", type=int, default=1, help="cycle number: the forecast starts at (cycle-1)*length hours")
    p.add_argument("--member", type=int, default=None, help="member ID (for messages only)")
    p.add_argument("--substeps", type=int, default=1, help="time steps per hour (more computation)")
    p.add_argument("--sleep", type=float, default=0.0, metavar="S", help="extra idle seconds (emulated cost)")
    p.add_argument("--variable", default="soil_moisture", help="state variable (default soil_moisture)")
    p.add_argument("--output", default=None, help="write the new restart here instead of replacing RESTART")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    m = DemoModel(length=args.length, start_hour=(args.cycle - 1) * args.length, substeps=args.substeps,
                  sleep=args.sleep, variable=args.variable)
    write_timings(run_model(args.restart, m, output=args.output))
    return 0


if __name__ == "__main__":
    # `python -m enkflow.cli.model` starts faster than the full CLI and needs nothing on PATH.
    import sys

    _p = argparse.ArgumentParser(prog="enkflow model")
    register(_p.add_subparsers())
    _args = _p.parse_args(["model", *sys.argv[1:]])
    sys.exit(_args.func(_args))
