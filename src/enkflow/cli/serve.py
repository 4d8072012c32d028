"""``enkflow serve EXPERIMENT.toml``: the assimilation server of an online experiment, alone.

Runners are started by someone else (by hand, a batch script, another
machine): each connects to the address the server prints with the token in
``EXPDIR/online/token``. Under ``mpiexec -n P`` the server runs on P ranks.
``enkflow run`` starts the server and the runners together and supervises them.
"""

from __future__ import annotations

import argparse
import sys

from enkflow.cli import COMMANDS
from enkflow.errors import ConfigError
from enkflow.experiment.config import load_experiment
from enkflow.fsutil import write_json_atomic
from enkflow.online.experiment import serve_experiment
from enkflow.online.launch import copy_initial, make_secrets
from enkflow.parallel import get_comm


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help=COMMANDS["serve"], description=__doc__)
    p.add_argument("config", help="experiment TOML file with [experiment] mode = \"online\"")
    p.add_argument("--port", type=int, default=None, help="control port (default [online] port, 0: any free one)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cfg = load_experiment(args.config)
    if cfg.experiment.mode != "online":
        raise ConfigError("enkflow serve needs [experiment] mode = \"online\"", key="experiment.mode", file=args.config)
    comm = get_comm()
    odir = cfg.dir.online
    if comm.rank == 0:
        odir.path.mkdir(parents=True, exist_ok=True)
        make_secrets(odir.path, curve=cfg.online.curve)
        copy_initial(cfg)
        write_json_atomic(odir.launch, {"port": args.port if args.port is not None else cfg.online.port})
        write_json_atomic(cfg.dir.config, cfg.to_json())
        print(f"token file: {odir.token}; the address will be in {odir.address}", file=sys.stderr, flush=True)
    comm.barrier()
    serve_experiment(cfg, comm=comm, progress=lambda m: print(m, file=sys.stderr, flush=True))
    return 0
