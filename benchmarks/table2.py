"""A miniature of Zheng et al. (GMD 2020) Table 2 on a real local SLURM.

Four strategies run the same offline experiment (N_e members of the demo
model, K cycles, the same analysis), with and without a bounded background
load of one-CPU jobs keeping an emulated node busy:

* ``dynamic``        N_j one-CPU pilots that span cycles (``[jobs] pilots =
                     "study"``): they wait while the analysis runs inside one of
                     them and take the next cycle's members; the next cycle's
                     pilots are submitted while the analysis runs;
* ``dynamic-cycle``  the previous dynamic scheme (``pilots = "cycle"``): pilots
                     leave when their cycle's list is empty, so every cycle
                     queues again;
* ``per-member``     one one-CPU job per member plus a dependent analysis job;
* ``single``         one job holding N_e CPUs for the whole cycle.

Each strategy runs its whole study (every cycle, one ``enkflow run``) under the
same load; the order of the strategies rotates with the seed. Per strategy it
reports total, queuing, running, I/O, analysis and pilot-idle seconds per cycle
(mean +- std over cycles, and as % of total), and the ratios of the dynamic
scheme's total to the others', per seed and as medians over ``--seeds``.
Dependent jobs queue from their eligible time, as on production machines
(``--queue``; see docs/jobs.md). Needs root (it starts slurmctld, slurmd and
munged, installing the Debian packages if absent).

    .venv/bin/python benchmarks/table2.py                       # the issue-25 load: about 30 min per seed
    .venv/bin/python benchmarks/table2.py --load-seconds 30 600 --load-distribution uniform   # long jobs
    .venv/bin/python benchmarks/table2.py --quick --json        # 2 cycles, one seed: a smoke test

Results go to stdout and ``bench-out/table2.json``; with ``--json`` the last line
is one JSON object with ``dynamic_over_single``, ``dynamic_over_per_member`` and
``dynamic_over_previous`` (medians over the seeds of the load scenario).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The local SLURM harness (enkflow_testing.localslurm) lives outside the installed package.
sys.path.insert(0, str(ROOT / "testing"))
TOY_ANALYSIS = ROOT / "tests" / "jobs_helpers" / "toy_analysis.py"


def write_experiment(root: Path, synth: Path, *, strategy: str, members: int, cycles: int, workers: int,
                     member_s: float, analysis: str, copy_inputs: bool = True, pilots: str = "study") -> Path:
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
pilots = "{pilots}"
workers = {workers}
time_limit = 600
poll = 0.2

[launcher]
kind = "slurm"
'''
    (root / "exp.toml").write_text(text)
    return root / "exp.toml"


STRATEGIES = ("dynamic", "dynamic-cycle", "per-member", "single")


def _strategy(name: str) -> tuple[str, str]:
    """``[jobs] strategy`` and ``pilots`` of a benchmark strategy."""
    return ("dynamic", "cycle") if name == "dynamic-cycle" else (name, "study")


def _ratios(totals: dict[str, float]) -> dict[str, float]:
    """The dynamic scheme's mean total per cycle over each other strategy's."""
    d = totals.get("dynamic")
    pairs = (("dynamic_over_single", "single"), ("dynamic_over_per_member", "per-member"),
             ("dynamic_over_previous", "dynamic-cycle"))
    return {k: d / totals[o] for k, o in pairs if d is not None and totals.get(o)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "table2"), help="work directory")
    ap.add_argument("--members", type=int, default=8, help="N_e (default 8)")
    ap.add_argument("--cycles", type=int, default=4, help="cycles per strategy, scenario and seed (default 4)")
    ap.add_argument("--node-cpus", type=int, default=16,
                    help="CPUs of the emulated node (default 16; at least N_e: the all-resources job needs N_e)")
    ap.add_argument("--member-seconds", type=float, default=6.0,
                    help="emulated cost of one forecast (default 6 s). It must be long against the ~0.1 s of CPU "
                         "a pilot needs to start: the emulated node has more CPUs than this machine has "
                         "cores, so N_e pilots starting at once take ~1 s here, not 0.1 s as on a real node")
    ap.add_argument("--load-jobs", type=int, default=None,
                    help="background jobs kept queued or running (default node CPUs + 8: a full node and a queue)")
    ap.add_argument("--workers", type=int, default=None, help="N_j pilots of the dynamic schemes (default N_e)")
    ap.add_argument("--load-seconds", type=float, nargs=2, default=(5.0, 300.0),
                    help="duration range of a load job (default 5-300 s: other users' jobs outlast a member, as on "
                         "production machines)")
    ap.add_argument("--load-distribution", choices=["loguniform", "uniform"], default="loguniform",
                    help="law of the load jobs' durations: log-uniform, as measured for production workloads "
                         "(Downey 1997; default), or uniform (with 30 600: the law of long jobs)")
    ap.add_argument("--analysis", choices=["auto", "builtin", "toy"], default="auto",
                    help="the built-in LETKF (needs enkflow.experiment.analysis_step) or the test's toy analysis")
    ap.add_argument("--queue", choices=["eligible", "submit"], default="eligible",
                    help="where a dependent job ranks: from its eligible time, as production multifactor priorities "
                         "do (default), or from its submission, as plain FIFO does")
    ap.add_argument("--scenarios", default="load", help="comma list of load,noload (default load)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma list of {','.join(STRATEGIES)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1], help="load seeds, one whole run each (default 1)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds the load runs before the first study (default: the longest load job, at most 300)")
    ap.add_argument("--quick", action="store_true", help="2 cycles, the first seed only")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the ratios")
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
    seeds = args.seeds[:1] if args.quick else args.seeds
    strategies = [s for s in args.strategies.split(",") if s]
    if not set(strategies) <= set(STRATEGIES):
        ap.error(f"--strategies: unknown {sorted(set(strategies) - set(STRATEGIES))}")
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    synth = out / "synth"
    generate(synth, size="tiny", members=args.members)
    node_cpus = max(args.node_cpus, args.members)
    load_jobs = args.load_jobs if args.load_jobs is not None else node_cpus + 8
    warmup = args.warmup if args.warmup is not None else min(300.0, max(args.load_seconds))
    results: dict[str, dict[str, dict]] = {}
    t_all = time.time()
    with LocalSlurm(out / "slurm", cpus=node_cpus, queue=args.queue):
        for scenario in args.scenarios.split(","):
            for seed in seeds:
                key = f"{scenario}/seed{seed}"
                results[key] = {}
                load = (BackgroundLoad(load_jobs, tuple(args.load_seconds), seed=seed, distribution=args.load_distribution)
                        if scenario == "load" else None)
                if load:
                    load.start()
                    time.sleep(warmup)  # let the load reach a steady state
                try:
                    r = seed % len(strategies)
                    for name in strategies[r:] + strategies[:r]:
                        root = out / scenario / f"seed{seed}" / name
                        strategy, pilots = _strategy(name)
                        toml = write_experiment(root, synth, strategy=strategy, pilots=pilots, members=args.members,
                                                cycles=cycles, workers=args.workers or args.members,
                                                member_s=args.member_seconds, analysis=analysis)
                        Experiment(load_experiment(toml)).run()
                        rep = load_report(root / "exp")
                        results[key][name] = {"summary": rep.summary(), "cycles": [c.total for c in rep.cycles],
                                              "analysis": [c.analysis_compute for c in rep.cycles],
                                              "pilot_idle": [c.pilot_idle for c in rep.cycles]}
                        print(f"[{time.time() - t_all:6.0f} s] {key:14} {name:13} total per cycle "
                              f"{rep.summary()['total']['mean']:7.2f} s, queuing {rep.summary()['queuing']['mean']:7.2f} s",
                              flush=True)
                finally:
                    if load:
                        load.stop()
                totals = {k: v["summary"]["total"]["mean"] for k, v in results[key].items()}
                results[key]["ratios"] = _ratios(totals)

    text = _table(args, analysis, cycles, node_cpus, load_jobs, results)
    print(text)
    medians = {k: statistics.median(v["ratios"][k] for kk, v in results.items() if kk.startswith("load/") and k in v["ratios"])
               for k in ("dynamic_over_single", "dynamic_over_per_member", "dynamic_over_previous")
               if any(k in v["ratios"] for kk, v in results.items() if kk.startswith("load/"))}
    (out.parent / "table2.json").write_text(json.dumps({"args": vars(args), "analysis": analysis, "results": results,
                                                         "medians": medians}, indent=1))
    (out.parent / "table2.txt").write_text(text)
    if args.json:
        print(json.dumps({**medians, "seeds": seeds, "cycles": cycles, "load_seconds": list(args.load_seconds),
                          "load_distribution": args.load_distribution}))
    return 0


def _table(args, analysis: str, cycles: int, node_cpus: int, load_jobs: int, results: dict) -> str:
    lines = [f"Table 2 miniature: N_e = {args.members}, {cycles} cycles per strategy, member cost "
             f"{args.member_seconds:g} s, emulated node of {node_cpus} CPUs on {os.cpu_count()} real cores, "
             f"dependent jobs ranked by {args.queue} time, "
             f"analysis: {analysis}; load: {load_jobs} one-CPU jobs of {args.load_seconds[0]:g}-{args.load_seconds[1]:g} s "
             f"({args.load_distribution}) kept queued/running",
             "per cycle, seconds: mean +- std over cycles (queue% etc.: share of the total); p.idle: pilot-seconds "
             "held idle between cycles", ""]
    for key, res in results.items():
        lines.append(f"{key}:")
        lines.append(f"  {'strategy':13} {'total s':>15} {'queuing s':>15} {'running s':>15} {'I/O s':>13} "
                     f"{'analysis s':>10} {'p.idle':>7} {'queue%':>7} {'run%':>6} {'I/O%':>6}")
        for name, r in res.items():
            if name == "ratios":
                continue
            s = r["summary"]
            f = lambda k: f"{s[k]['mean']:6.2f} +- {s[k]['std']:5.2f}"  # noqa: E731
            lines.append(f"  {name:13} {f('total'):>15} {f('queuing'):>15} {f('running'):>15} {f('io'):>13} "
                         f"{statistics.fmean(r['analysis']):10.2f} {statistics.fmean(r['pilot_idle']):7.2f} "
                         f"{s['queuing']['pct_mean']:6.1f} {s['running']['pct_mean']:6.1f} {s['io']['pct_mean']:6.1f}")
        if res.get("ratios"):
            lines.append("  ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in res["ratios"].items()))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
