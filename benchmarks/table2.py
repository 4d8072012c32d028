"""A miniature of Zheng et al. (GMD 2020) Table 2 on a real local SLURM.

Three strategies run the same offline experiment (N_e members of the demo
model, K cycles, the same analysis), with and without a bounded background
load of one-CPU jobs keeping an emulated node busy:

* ``dynamic``     N_j one-CPU pilot jobs pulling from the to-do list;
* ``per-member``  one one-CPU job per member plus a dependent analysis job;
* ``single``      one job holding N_e CPUs for the whole cycle.

Per strategy it reports total, queuing, running and I/O seconds per cycle
(mean +- std over cycles, and as % of total) and the ratios of the dynamic
scheme's total to the others'. Dependent jobs queue from their eligible
time, as on production machines (``--queue``; see docs/jobs.md). Needs
root (it starts slurmctld, slurmd and munged, installing the Debian
packages if absent).

    .venv/bin/python benchmarks/table2.py            # about 65 minutes
    .venv/bin/python benchmarks/table2.py --quick    # 2 cycles, for a smoke test

Results go to stdout and ``bench-out/table2.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The local SLURM harness (enkflow_testing.localslurm) lives outside the installed package.
sys.path.insert(0, str(ROOT / "testing"))
TOY_ANALYSIS = ROOT / "tests" / "jobs_helpers" / "toy_analysis.py"


def write_experiment(root: Path, synth: Path, *, strategy: str, members: int, cycles: int, workers: int,
                     member_s: float, analysis: str, copy_inputs: bool = True) -> Path:
    from enkflow_testing.experiments import stage_inputs

    stage_inputs(root, synth, members=members, cycles=cycles, copy_members=copy_inputs)
    py = sys.executable
    if analysis == "builtin":
        ana = '''[state]
variables = ["soil_moisture"]

[analysis]
method = "letkf"
localization = { radius = 1500.0, metric = "sphere" }
inflation = { prior = 1.1 }
'''
    else:
        ana = f'''[analysis_task]
command = "{py} {TOY_ANALYSIS} {{config}} {{cycle}}"
'''
    text = f'''[experiment]
directory = "exp"
cycles = {cycles}
members = {members}
restart = "members/member_{{member:04d}}.nc"
forecast_length = 6

[model]
command = "{py} -m enkflow.cli.model {{restart}} --length {{length}} --cycle {{cycle}} --sleep {member_s}"

[observations]
file = "obs/obs_{{cycle:03d}}.nc"

{ana}
[jobs]
strategy = "{strategy}"
workers = {workers}
time_limit = 600
poll = 0.2

[launcher]
kind = "slurm"
'''
    (root / "exp.toml").write_text(text)
    return root / "exp.toml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "table2"), help="work directory")
    ap.add_argument("--members", type=int, default=8, help="N_e (default 8)")
    ap.add_argument("--cycles", type=int, default=10,
                    help="cycles per strategy and scenario (default 10: a cycle's total varies by ~25%% under load)")
    ap.add_argument("--node-cpus", type=int, default=None,
                    help="CPUs of the emulated node (default N_e: the all-resources job needs the whole node)")
    ap.add_argument("--member-seconds", type=float, default=6.0,
                    help="emulated cost of one forecast (default 6 s). It must be long against the ~0.1 s of CPU "
                         "a pilot needs to start: the emulated node has 4x more CPUs than this machine has "
                         "cores, so N_e pilots starting at once take ~1 s here, not 0.1 s as on a real node")
    ap.add_argument("--load-jobs", type=int, default=None,
                    help="background jobs kept queued or running (default node CPUs + 6: a full node and a queue)")
    ap.add_argument("--workers", type=int, default=None, help="N_j pilots of the dynamic scheme (default N_e)")
    ap.add_argument("--load-seconds", type=float, nargs=2, default=(10.0, 120.0),
                    help="duration range of a load job (default 10-120 s: other users' jobs outlast a member, as on "
                         "production machines)")
    ap.add_argument("--load-distribution", choices=["loguniform", "uniform"], default="loguniform",
                    help="law of the load jobs' durations: log-uniform, as measured for production workloads "
                         "(Downey 1997; default), or uniform")
    ap.add_argument("--analysis", choices=["auto", "builtin", "toy"], default="auto",
                    help="the built-in LETKF (needs enkflow.experiment.analysis_step) or the test's toy analysis")
    ap.add_argument("--queue", choices=["eligible", "submit"], default="eligible",
                    help="where a dependent job ranks: from its eligible time, as production multifactor priorities "
                         "do (default), or from its submission, as plain FIFO does")
    ap.add_argument("--scenarios", default="load,noload", help="comma list of load,noload")
    ap.add_argument("--quick", action="store_true", help="2 cycles per run")
    args = ap.parse_args()
    # SIGTERM (timeout, kill) must still stop the SLURM daemons: leave through the context managers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    import importlib.util

    from enkflow.experiment import Experiment, load_experiment
    from enkflow.models.synthetic_land_files import generate
    from enkflow.report import load_report
    from enkflow_testing.localslurm import BackgroundLoad, LocalSlurm, missing_reason

    reason = missing_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    analysis = args.analysis
    if analysis == "auto":
        analysis = "builtin" if importlib.util.find_spec("enkflow.experiment.analysis_step") else "toy"
    cycles = 2 if args.quick else args.cycles
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    synth = out / "synth"
    generate(synth, size="tiny", members=args.members)
    node_cpus = args.node_cpus or args.members
    load_jobs = args.load_jobs if args.load_jobs is not None else node_cpus + 6
    strategies = ["dynamic", "per-member", "single"]
    results: dict[str, dict[str, dict]] = {}
    t_all = time.time()
    with LocalSlurm(out / "slurm", cpus=node_cpus, queue=args.queue):
        for scenario in args.scenarios.split(","):
            results[scenario] = {}
            load = (BackgroundLoad(load_jobs, tuple(args.load_seconds), seed=42, distribution=args.load_distribution)
                    if scenario == "load" else None)
            if load:
                load.start()
                time.sleep(max(args.load_seconds))  # let the load reach a steady state
            try:
                # Cycles interleaved across strategies (cycle k of each, then k+1): every strategy sees
                # the same load statistics. The order rotates each cycle: a strategy that follows the
                # all-resources job finds the node refilled by load jobs that all started together,
                # whose first ends come later than in the steady state; with a fixed order one
                # strategy would always pay for that. Raising experiment.cycles resumes an experiment.
                for k in range(1, cycles + 1):
                    r = (k - 1) % len(strategies)
                    for strategy in strategies[r:] + strategies[:r]:
                        root = out / scenario / strategy
                        toml = write_experiment(root, synth, strategy=strategy, members=args.members, cycles=k,
                                                workers=args.workers or args.members, member_s=args.member_seconds,
                                                analysis=analysis, copy_inputs=(k == 1))
                        Experiment(load_experiment(toml)).run()
                        rep = load_report(root / "exp")
                        c = rep.cycles[-1]
                        print(f"[{time.time() - t_all:6.0f} s] {scenario:7} cycle {k} {strategy:10} total {c.total:6.2f} s, "
                              f"queuing {c.queuing:6.2f} s", flush=True)
                for strategy in strategies:
                    rep = load_report(out / scenario / strategy / "exp")
                    results[scenario][strategy] = {"summary": rep.summary(), "cycles": [c.total for c in rep.cycles]}
            finally:
                if load:
                    load.stop()

    lines = [f"Table 2 miniature: N_e = {args.members}, {cycles} cycles per strategy, member cost "
             f"{args.member_seconds:g} s, emulated node of {node_cpus} CPUs on {__import__('os').cpu_count()} real cores, "
             f"dependent jobs ranked by {args.queue} time, "
             f"analysis: {analysis}; load: {load_jobs} one-CPU jobs of {args.load_seconds[0]:g}-{args.load_seconds[1]:g} s "
             f"({args.load_distribution}) kept queued/running",
             ""]
    for scenario, res in results.items():
        lines.append(f"{scenario}:")
        lines.append(f"  {'strategy':10} {'total s':>15} {'queuing s':>15} {'running s':>15} {'I/O s':>13} {'queue%':>7} {'run%':>6} {'I/O%':>6}")
        for strategy, r in res.items():
            s = r["summary"]
            f = lambda k: f"{s[k]['mean']:6.2f} +- {s[k]['std']:5.2f}"  # noqa: E731
            lines.append(f"  {strategy:10} {f('total'):>15} {f('queuing'):>15} {f('running'):>15} {f('io'):>13} "
                         f"{s['queuing']['pct_mean']:6.1f} {s['running']['pct_mean']:6.1f} {s['io']['pct_mean']:6.1f}")
        tot = {k: v["summary"]["total"]["mean"] for k, v in res.items()}
        if {"dynamic", "per-member", "single"} <= tot.keys():
            r1, r2 = tot["dynamic"] / tot["per-member"], tot["dynamic"] / tot["single"]
            best = min(tot["per-member"], tot["single"])
            lines.append(f"  ratios: dynamic/per-member = {r1:.2f}, dynamic/single = {r2:.2f}, dynamic/best other = {tot['dynamic'] / best:.2f}")
            res["ratios"] = {"dynamic_per_member": r1, "dynamic_single": r2, "dynamic_best": tot["dynamic"] / best}
        lines.append("")
    text = "\n".join(lines)
    print(text)
    (out.parent / "table2.json").write_text(json.dumps({"args": vars(args), "analysis": analysis, "results": results}, indent=1))
    (out.parent / "table2.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
