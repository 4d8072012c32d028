"""`enkflow bench ...`: measurements that compare enkflow with its baselines in one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from enkflow.bench.analysis import AnalysisBenchSetup, run
from enkflow.bench.io import add_parser as add_io
from enkflow.bench.land import LandBenchSetup, main_json
from enkflow.bench.land_layouts import LayoutRuns
from enkflow.bench.online import run_online
from enkflow.bench.online_scale import run_scale
from enkflow.bench.output import add_parser as add_output
from enkflow.cli import COMMANDS
from enkflow.errors import InputError


def _add_analysis(bsub: argparse._SubParsersAction) -> None:
    a = bsub.add_parser(
        "analysis",
        help="local analysis time per grid point vs a NumPy/SciPy baseline (whole analysis and kernel only)",
        description="Time per grid point of LETKF on smooth random fields (Cartesian grid, H = identity at a "
        "random fraction of points, GC weights reaching 0 at --cutoff grid units), with the split, peak memory, "
        "and the NumPy/SciPy baseline from the same run (one batched KD-tree search, then per-point LAPACK): "
        "the whole-analysis ratio and the kernel-only ratio (search excluded on both sides), per core.",
    )
    a.add_argument("--nx", type=int, default=1000)
    a.add_argument("--ny", type=int, default=1000)
    a.add_argument("--members", type=int, default=40)
    a.add_argument("--obs-fraction", type=float, default=0.1)
    a.add_argument("--obs-std", type=float, default=0.25)
    a.add_argument("--cutoff", type=float, default=10.0, help="distance (grid units) where the GC weight reaches 0")
    a.add_argument("--ranks", default="1", help="MPI process count, or a comma list (e.g. 1,2) to measure the speed-up")
    a.add_argument("--baseline-points", type=int, default=2000, help="points the baseline analyses (default 2000)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--json", action="store_true", help="end with one JSON line")
    a.set_defaults(func=_analysis)


def _add_land(bsub: argparse._SubParsersAction) -> None:
    g = bsub.add_parser(
        "land",
        help="the synthetic global land problem analysed from its restart files (RMSE, time, memory)",
        description="Synthesize the Zheng et al. (2020) land problem (or reuse --dir), analyse it from the restart "
        "files with a local filter on the sphere, update them in place; report RMSE vs truth, stage times and "
        "peak memory against the ensemble's size. With --layout both (default) the analysis runs twice, the "
        "observations replicated on every rank (on a copy of the members) and distributed by locality, and the "
        "report gives both layouts' observations, observation-space and H(x) exchange bytes and peak RSS per rank.",
    )
    g.add_argument("--size", choices=["tiny", "small", "medium", "large"], default="medium")
    g.add_argument("--members", type=int, default=40)
    g.add_argument("--cutoff-km", type=float, default=150.0, help="distance where the GC weight reaches 0 (km)")
    g.add_argument("--method", choices=["letkf", "lestkf", "lnetf", "ensrf"], default="lestkf")
    g.add_argument("--dir", type=Path, default=None, help="reuse (or create) the synthetic files here")
    g.add_argument("--keep", action="store_true", help="keep the temporary files")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ranks", type=int, default=1, help="MPI processes for the analysis (mpiexec when > 1; default 1)")
    g.add_argument("--no-balance", dest="balance", action="store_false",
                   help="analyse each rank's I/O row block instead of rows of equal estimated work")
    g.add_argument("--max-obs", type=int, default=None, metavar="K",
                   help="cap: at most the K nearest observations per local domain (approximate; default: all)")
    g.add_argument("--obs-fraction", type=float, default=None, metavar="F",
                   help="observations per land point on average when synthesizing (enkflow synth --obs-fraction: F > 1 "
                        "observes every point floor(F) times and a random F - floor(F) of them once more; default: "
                        "synth's, 0.1; with --dir it must match the files there)")
    g.add_argument("--layout", choices=[v.value for v in LayoutRuns], default=LayoutRuns.BOTH.value,
                   help="[analysis] observations: each rank holds the observations its domains see (distributed), "
                        "every rank holds all (replicated), or both, the replicated first on a copy of the members, "
                        "compared bit for bit (default both)")
    g.add_argument("--json", action="store_true", help="end with one JSON line")
    g.set_defaults(func=_land)


def _add_online(bsub: argparse._SubParsersAction) -> None:
    o = bsub.add_parser(
        "online",
        help="online mode: state exchange rate vs raw pyzmq (TCP) and vs a memory copy (shared memory), and seconds "
        "per cycle online vs offline",
        description="On one node: the rate at which the online server and its runners exchange member states "
        "(a model that does nothing; the forecast phases timed) over loopback TCP against a raw pyzmq transfer of the "
        "same bytes with the same streams, and over shared memory against a memory copy (np.copyto) of the same "
        "bytes, all in this run; then the demo problem offline and online (seconds per cycle). "
        "See enkflow.bench.online for exactly what is timed.",
    )
    o.add_argument("--state-mb", type=float, default=100.0, help="MB (1e6 bytes) of float64 state per member (default 100)")
    o.add_argument("--ranks", type=int, default=2, help="server MPI ranks (mpiexec when > 1; default 2)")
    o.add_argument("--runners", type=int, default=4, help="runner processes (default 4)")
    o.add_argument("--members", type=int, default=8, help="ensemble members (default 8)")
    o.add_argument("--cycles", type=int, default=2, help="timed cycles, after one warm-up cycle (default 2)")
    o.add_argument("--check", action="store_true", help="checksum every exchanged state (slower: not for timing)")
    o.add_argument("--no-compare", action="store_true", help="skip the online vs offline demo comparison")
    _online_run_options(o)
    o.set_defaults(func=run_online)


def _add_online_scale(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "online-scale",
        help="online mode at scale: 1000 Lorenz-96 members on 16 runners, the server's cost per member exchange",
        description="Lorenz-96 members through the online server (ETKF, every variable observed); the forecast "
        "phases' wall time per member exchange and what the runners spent. See enkflow.bench.online_scale.",
    )
    s.add_argument("--members", type=int, default=1000, help="ensemble members (default 1000)")
    s.add_argument("--runners", type=int, default=16, help="runner processes (default 16)")
    s.add_argument("--ranks", type=int, default=2, help="server MPI ranks (mpiexec when > 1; default 2)")
    s.add_argument("--cycles", type=int, default=3, help="timed cycles, after one warm-up cycle (default 3)")
    s.add_argument("--model", choices=["zero", "l96"], default="zero",
                   help="zero: the runners send back what they got (the exchange's cost alone); l96: one RK4 step")
    s.add_argument("--check", action="store_true", help="checksum every exchanged state")
    _online_run_options(s)
    s.set_defaults(func=run_scale)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=COMMANDS["bench"], description=__doc__)
    bsub = p.add_subparsers(dest="bench", metavar="BENCH")
    bsub.required = True
    _add_analysis(bsub)
    _add_land(bsub)
    _add_online(bsub)
    _add_online_scale(bsub)
    add_io(bsub)
    add_output(bsub)


def _online_run_options(p: argparse.ArgumentParser) -> None:
    """The options both online benchmarks share: time limit, files, seed, JSON."""
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before a stuck run is stopped")
    p.add_argument("--dir", default=None, help="where to put the temporary files (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temporary files (logs, event logs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="end with one JSON line")


def _analysis(args: argparse.Namespace) -> int:
    try:
        ranks = [int(r) for r in str(args.ranks).split(",")]
    except ValueError:
        raise InputError(f"--ranks must be integers, got {args.ranks!r}", item="ranks") from None
    if any(r < 1 for r in ranks):
        raise InputError("--ranks must be >= 1", item="ranks")
    s = AnalysisBenchSetup(
        nx=args.nx, ny=args.ny, members=args.members, obs_fraction=args.obs_fraction, obs_std=args.obs_std,
        cutoff=args.cutoff, baseline_points=args.baseline_points, seed=args.seed,
    )
    results = []
    for r in ranks:
        print(f"bench analysis: {s.nx}x{s.ny}, N={s.members}, {r} rank(s) ...", file=sys.stderr)
        res = run(s, r)
        results.append(res)
        print(_analysis_lines(res))
    out = dict(results[0])
    if len(results) > 1:
        out["by_ranks"] = {str(r["ranks"]): r for r in results}
        out["speedup_by_ranks"] = {str(r["ranks"]): results[0]["wall_s"] / r["wall_s"] for r in results}
        print("speed-up vs " + str(ranks[0]) + " rank(s): " + ", ".join(f"{k}: {v:.2f}x" for k, v in out["speedup_by_ranks"].items()))
    if args.json:
        print(json.dumps(out))
    return 0


def _analysis_lines(res: dict) -> str:
    """The text report of one rank count: both ratios beside their baselines (ms per point per core)."""
    sp, bp = res["split_ms_per_point"], res["baseline_split_ms_per_point"]
    return (
        f"ranks={res['ranks']}: {res['ms_per_point']:.4f} ms/point wall, {res['core_ms_per_point']:.4f} per core; "
        f"local obs {res['mean_local_obs']:.1f}; RMSE prior {res['rmse_prior']:.4f} -> {res['rmse_analysis']:.4f}; "
        f"peak RSS {res['peak_rss_mb']:.0f} MB (ensemble {res['ensemble_mb']:.0f} MB)\n"
        f"  whole analysis  enkflow {res['core_ms_per_point']:.4f} ms/point (search {sp['search']:.4f}) | "
        f"baseline {res['baseline_ms_per_point']:.4f} (batched search {bp['search']:.4f}) "
        f"-> {res['speedup_vs_baseline']:.1f}x\n"
        f"  kernel only     enkflow {res['kernel_ms_per_point']:.4f} ms/point (build {sp['build']:.4f}, "
        f"eigen {sp['eigen']:.4f}, transform {sp['transform']:.4f}) | "
        f"baseline per-point LAPACK {res['baseline_kernel_ms_per_point']:.4f} (build {bp['build']:.4f}, "
        f"eigen {bp['eigen']:.4f}, transform {bp['transform']:.4f}) -> {res['kernel_speedup_vs_baseline']:.1f}x\n"
        f"  max rel diff vs baseline {res['max_rel_diff_vs_baseline']:.2e} on {res['baseline_points']} points"
    )


def _land(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise InputError("--ranks must be >= 1", item="ranks")
    s = LandBenchSetup(size=args.size, members=args.members, cutoff_km=args.cutoff_km, method=args.method, seed=args.seed,
                       ranks=args.ranks, balance=args.balance, max_obs=args.max_obs, obs_fraction=args.obs_fraction)
    return main_json(s, args.dir, args.keep, args.json, LayoutRuns(args.layout))
