"""The ``enkflow`` command line. Each sub-command lives in its own module
``enkflow.cli.<name>`` with ``register(subparsers)``; it is listed in COMMANDS."""

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

# Sub-command modules, in the order `enkflow --help` lists them.
COMMANDS = [
    "l96",
    "bench",
    "synth",
    "run",
    "serve",
    "worker",
    "report",
    "model",
    "demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enkflow",
        description="Ensemble data assimilation with short time-to-solution.",
    )
    parser.add_argument("--version", action="version", version=f"enkflow {enkflow.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"enkflow.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
