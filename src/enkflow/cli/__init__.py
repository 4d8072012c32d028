"""The ``enkflow`` command line. Each sub-command lives in its own module
``enkflow.cli.<name>`` with ``register(subparsers)``; it is listed in COMMANDS with its help line."""

from __future__ import annotations

import os

# enkflow parallelizes with processes (MPI ranks, pilot workers); BLAS threads on
# its small matrices only oversubscribe the cores. Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib
import sys

import enkflow
from enkflow.errors import EnkflowError

# The sub-commands, in the order `enkflow --help` lists them, with the line it shows for each. Only the module
# of the command that runs is imported (``enkflow.cli.<name>``, its ``register(subparsers)``): each loads the
# layers it drives, which `enkflow --version`, `--help` and the other commands need not pay.
COMMANDS: dict[str, str] = {
    "l96": "Lorenz-96 twin experiment: time-mean analysis RMSE and spread",
    "bench": "benchmarks against baselines",
    "synth": "write the synthetic global land problem: member restarts, truth, observations",
    "run": "run (or resume) a cycling experiment (offline, or online with [experiment] mode = \"online\")",
    "serve": "run the assimilation server of an online experiment (runners connect to it)",
    "worker": "pilot worker: run tasks from a cycle's to-do list until it is empty",
    "report": "time-to-solution table of an experiment directory",
    "model": "bundled demo model: advance one restart file (atomically)",
    "demo": "run a small offline twin experiment end to end (about a minute)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every sub-command listed, ``command``'s with its arguments."""
    parser = argparse.ArgumentParser(
        prog="enkflow",
        description="Ensemble data assimilation with short time-to-solution.",
    )
    parser.add_argument("--version", action="version", version=f"enkflow {enkflow.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, line in COMMANDS.items():
        if name == command:
            importlib.import_module(f"enkflow.cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=line)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The first word names the command (the only options before it, --help and --version, exit).
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EnkflowError as exc:
        print(f"enkflow {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"enkflow {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
