"""``enkflow bench output``: the demo model writing its field every step, three ways in one run.

1. no output: the model alone;
2. synchronous output: the model appends the field to one NetCDF-4 file each step with netCDF4
   (same dtype and compression as the server's files): the baseline a user would write;
3. through :class:`~enkflow.output.Output`: ``add`` each step, the writer process does the rest
   (compressed: one NetCDF-4 file per step; ``--compression none``: the field's one growing file);

and a probe of the machine, not of enkflow: the model without output while a busy loop (no memory
traffic, no system calls) runs at the writer's niceness and on its CPUs. Where the CPUs are
independent it costs the model nothing; where they share a core or a clock (SMT siblings, a
virtual machine's vCPUs, turbo limits) it shows what any work beside the model costs it, the
writer's included.

By default the writer has a CPU of its own (the last this process may use) and the model, this
process in all four runs alike, the others: the set-up of an I/O server (``--writer-cpus``).

Timed: the model's wall time from its first to its last step (``model_s_*``). The server's
start-up and its final ``close`` (which waits for the writer to drain) are reported apart
(``server_start_s``, ``server_drain_s``); the largest backlog shows whether the writer keeps up.
The four runs make one round, repeated ``--repeat`` times in the orders of a Williams square
(:data:`ORDERS`): over each 4 rounds every run takes every place once and follows every other run
once, so a steady drift of the machine's speed cancels, and one run's after-effects on the next
fall on each path alike. The overheads are the medians of the rounds' own ratios (each path
against the no-output run of its round), the times the medians of each path's times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from enkflow.bench.output_runs import report, run
from enkflow.errors import InputError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``output`` under ``enkflow bench``."""
    p = sub.add_parser(
        "output",
        help="model time with no output, synchronous NetCDF output, and output through the asynchronous server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nx", type=int, default=720, help="grid cells in longitude (default 720)")
    p.add_argument("--ny", type=int, default=360, help="grid cells in latitude (default 360)")
    p.add_argument("--steps", type=int, default=60, help="model steps, one output each (default 60)")
    p.add_argument("--substeps", type=int, default=6,
                   help="demo model substeps per step: its cost per output (default 6: synchronous output "
                        "costs about 40%% of the model's time, the set-up of the target)")
    p.add_argument("--dtype", choices=["float32", "float64", "int16"], default="float32")
    p.add_argument("--compression", choices=["none", "zlib", "zstd"], default="zlib")
    p.add_argument("--complevel", type=int, default=4, help="compression level of both writers (default 4, netCDF4's)")
    p.add_argument("--transport", choices=["shm", "ipc", "tcp"], default="shm")
    p.add_argument("--writer-nice", type=int, default=None,
                   help="niceness the writer adds to the model's (default: output.writer_nice's default, 10)")
    p.add_argument("--writer-cpus", default="auto",
                   help="pin the writer to these CPUs, e.g. '1' or '2,3', and the model to the others it may use; "
                        "'auto' (default): the writer on the last CPU this process may use, the model on the rest "
                        "(an I/O server with a core of its own, as XIOS runs); 'none': placement left to the scheduler")
    p.add_argument("--repeat", type=int, default=8,
                   help="rounds of the four runs (default 8; medians reported); a multiple of 4 balances their order")
    p.add_argument("--dir", default=None, help="where the files go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the files")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.set_defaults(func=main)


def _placement(spec: str) -> tuple[list[int], list[int]]:
    """(writer CPUs, model CPUs) for ``--writer-cpus``; pins this process (the model) to its CPUs."""
    mine = sorted(os.sched_getaffinity(0))
    if spec == "none" or (spec == "auto" and len(mine) < 2):
        return [], mine
    if spec == "auto":
        writer = mine[-1:]
    else:
        try:
            writer = sorted({int(c) for c in spec.split(",") if c.strip()})
        except ValueError:
            raise InputError(f"--writer-cpus {spec!r}: a list of CPU numbers, 'auto' or 'none'", item="writer-cpus") from None
        if not writer or writer[0] < 0:
            raise InputError(f"--writer-cpus {spec!r}: a list of CPU numbers, 'auto' or 'none'", item="writer-cpus")
    try:  # the writer and the probe will pin themselves there: find out now, before anything runs
        os.sched_setaffinity(0, writer)
    except OSError as exc:
        raise InputError(f"--writer-cpus {spec!r}: cannot run there ({exc}); this process may use CPUs {mine}",
                         item="writer-cpus") from None
    model = [c for c in mine if c not in writer] or mine
    os.sched_setaffinity(0, model)
    return writer, model


def main(args: argparse.Namespace) -> int:
    for name in ("nx", "ny", "steps", "substeps", "repeat"):
        if getattr(args, name) < 1 or (name in ("nx", "ny") and getattr(args, name) < 2):
            raise InputError(f"--{name} is too small: {getattr(args, name)}", item=name)
    args.writer_cpu_list, args.model_cpu_list = _placement(args.writer_cpus)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="enkflow-bench-output-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"bench output: {args.nx}x{args.ny} field, {args.steps} steps x {args.substeps} substeps, "
          f"{args.dtype} {args.compression}, {args.repeat} round(s), in {root} ...", file=sys.stderr)
    try:
        r = run(args, root)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    report(r)
    if args.json:
        print(json.dumps(r))
    return 0
