"""``enkflow demo``: the first thing to run after installing.

Synthesizes a small land problem, runs offline cycles with the local
launcher, the dynamic job scheme and the bundled demo model, shows progress,
and ends with the timing table and the analysis RMSE against the truth.
"""

from __future__ import annotations

import argparse

from enkflow.cli import COMMANDS
from enkflow.apps.demo import DemoSettings, run_demo
from enkflow.config import Method


def register(sub: argparse._SubParsersAction) -> None:
    d = DemoSettings()
    p = sub.add_parser("demo", help=COMMANDS["demo"], description=__doc__)
    p.add_argument("--dir", default="enkflow-demo", help="working directory, emptied first (default ./enkflow-demo)")
    p.add_argument("--members", type=int, default=d.members, help=f"ensemble size (default {d.members})")
    p.add_argument("--cycles", type=int, default=d.cycles, help=f"assimilation cycles (default {d.cycles})")
    p.add_argument("--workers", type=int, default=None, help="pilot workers N_j (default: min(members, CPUs))")
    p.add_argument("--seed", type=int, default=d.seed, help="problem seed")
    p.add_argument("--analysis-command", default=None,
                   help="run this analysis program instead of the built-in LETKF (an [analysis_task] command template)")
    p.add_argument("--mode", choices=["offline", "online"], default="offline",
                   help="offline: restart files and the job scheme; online: an assimilation server and runners "
                        "exchange the states in memory (same analysis, same results)")
    p.add_argument("--runners", type=int, default=d.runners, help=f"online: runner processes (default {d.runners})")
    p.add_argument("--method", choices=[m.value for m in Method], default=d.method.value,
                   help=f"the analysis method, its options at their defaults (default {d.method.value}; docs/analysis.md)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    s = DemoSettings(members=args.members, cycles=args.cycles, workers=args.workers, seed=args.seed,
                     analysis_command=args.analysis_command, mode=args.mode, runners=args.runners,
                     method=Method(args.method))
    run_demo(args.dir, s, say=lambda m: print(m, flush=True))
    return 0
