"""Node-loss trials on the emulated cluster (issue 22, acceptance 2): randomized faults, each trial compared
byte for byte with the fault-free run.

    python benchmarks/node_loss_trials.py [--trials 20] [--scenario NAME|all] [--seed 0] [--json OUT] [--keep]

Starts its own cluster in a box (``testing/enkflow_testing/cluster.py``, docs/testing.md; needs root):
``--nodes`` compute nodes with one CPU each and SLURM, plus login nodes ``l1`` (the launcher) and ``l2``
(a rerun after ``l1`` is lost). The study is the demo problem (tiny land, LETKF), offline (2 pilots of 2
nodes, the analysis as 2 MPI ranks on 2 nodes) or online (a 2-rank server on 2 nodes, 2 runners on others);
see ``testing/enkflow_testing/node_loss.py`` for what a trial does and measures, and the scenarios:

online-server-node     the node of a server rank lost
online-runner-node     a node of runners lost
online-launcher-node   l1 (``enkflow run``) lost, then ``enkflow run`` again from l2
online-kill-run        ``kill -9`` of ``enkflow run`` alone, then a rerun
offline-analysis-node-before-commit  rank 0's node of an analysis lost before its update's commit
offline-analysis-node-after-commit   a node of an analysis lost right after the commit (rank 0 held there)
offline-pilot-node     the node of a running pilot lost
offline-kill-run       ``kill -9`` of ``enkflow run`` alone, then a rerun

Prints one line per trial, a table per scenario, the harness's start-up time and one JSON line; exits 1
when any trial did not complete bitwise equal or left a process or a /dev/shm name of the study behind.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))

from enkflow_testing.cluster import Cluster  # noqa: E402
from enkflow_testing.node_loss import NodeLossTrials, Scenario, TrialResult  # noqa: E402

REDRAWS = 3  # a trial whose run ended before its moment is drawn again at most this often
COLUMNS = ("scenario", "trials", "redrawn", "injected", "on target", "completed", "bitwise", "left procs", "left shm",
           "left wal", "recomputed", "in flight", "rec<=flight", "wall s")


def _line(r: TrialResult) -> str:
    left = "".join(f" LEFT {k}: {v}" for k, v in (("procs", r.left_processes), ("shm", r.left_shm),
                                                   ("wal", r.left_wal)) if v)
    return (f"{r.scenario} #{r.n}: at {r.at_s:.1f} s, {r.fault or '-'}; rc {r.rc}, "
            f"{'bitwise equal' if r.equal else 'NOT EQUAL' if r.completed else 'NOT COMPLETED'}, recomputed "
            f"{r.recomputed} (in flight {r.in_flight}), {r.seconds:.1f} s{left}"
            + (f"\n    {r.detail.strip()[-400:]}" if r.detail and not r.ok else ""))


def _stats(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


def table_row(scenario: str, rs: list[TrialResult], redrawn: int) -> list[str]:
    done = [r for r in rs if r.injected]
    counts = [len(rs), redrawn, len(done), sum(r.on_target for r in done), sum(r.completed for r in rs),
              sum(r.equal for r in rs), sum(bool(r.left_processes) for r in rs), sum(bool(r.left_shm) for r in rs),
              sum(bool(r.left_wal) for r in rs)]
    return [scenario, *map(str, counts), _stats([r.recomputed for r in done], "{:g}"),
            _stats([r.in_flight for r in done], "{:g}"), str(sum(r.recomputed <= r.in_flight for r in done)),
            _stats([r.seconds for r in rs])]


def print_table(rows: list[list[str]], flush: bool = False) -> None:
    widths = [max(len(x) for x in col) for col in zip(COLUMNS, *rows)]
    for row in (COLUMNS, *rows):
        print("| " + " | ".join(x.ljust(w) for x, w in zip(row, widths)) + " |", flush=flush)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per scenario")
    ap.add_argument("--scenario", default="all", choices=["all", *(s.value for s in Scenario)])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write every trial's record here")
    ap.add_argument("--keep", action="store_true", help="keep the experiment root (a failed trial's study copied)")
    ap.add_argument("--nodes", type=int, default=5, help="compute nodes: 4 busy (2+2) and one to restart on")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--slurmd-timeout", type=int, default=3, help="s until SLURM finds a lost node not responding")
    ap.add_argument("--grace", type=float, default=12.0, help="s the study's leftovers may take to go after its run")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="s one enkflow run may take (then: a hang)")
    ap.add_argument("--root", type=Path, default=Path("/var/tmp"), help="parent of the experiment root (shared)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still removes its cluster
    scenarios = list(Scenario) if a.scenario == "all" else [Scenario(a.scenario)]
    root = a.root / f"enk-node-loss-{os.getpid()}"
    root.mkdir(parents=True)
    results: dict[str, list[TrialResult]] = {s.value: [] for s in scenarios}
    redrawn = {s.value: 0 for s in scenarios}
    t_start = time.monotonic()
    with Cluster(n_nodes=a.nodes, login_nodes=2, slurm=True, cpus_per_node=1, slurmd_timeout_s=a.slurmd_timeout) as c:
        startup = dict(c.startup_s)
        print(f"cluster start-up (s): nodes {startup['nodes']:.2f}, SLURM {startup['slurm']:.2f}", flush=True)
        trials = NodeLossTrials(c, root, members=a.members, cycles=a.cycles, seed=a.seed, grace_s=a.grace,
                                run_timeout_s=a.run_timeout)
        for s in scenarios:
            ref = trials.reference(s.mode)
            print(f"{s.value}: fault-free run {ref.seconds:.1f} s, {ref.forecasts} forecasts", flush=True)
            for n in range(1, a.trials + 1):
                r = trials.trial(s, n)
                for _ in range(REDRAWS):  # the run ended before the moment: draw it again, and say so
                    if r.injected:
                        break
                    print(_line(r) + " (redrawn)", flush=True)
                    redrawn[s.value] += 1
                    r = trials.trial(s, n)
                results[s.value].append(r)
                print(_line(r), flush=True)
                if a.keep and not r.ok:
                    shutil.copytree(trials.study, root / f"failed-{s.value}-{n}", symlinks=True)
            print_table([table_row(s.value, results[s.value], redrawn[s.value])], flush=True)
    rows = [table_row(s, rs, redrawn[s]) for s, rs in results.items()]
    print(f"\n{a.trials} trials per scenario, seed {a.seed}, {a.nodes} nodes + 2 login nodes, "
          f"{a.members} members x {a.cycles} cycles; {time.monotonic() - t_start:.0f} s in all")
    print_table(rows)
    print(f"cluster start-up (s): nodes {startup['nodes']:.2f}, SLURM {startup['slurm']:.2f}")
    records = [r.row() for rs in results.values() for r in rs]
    if a.json:
        a.json.write_text(json.dumps({"startup_s": startup, "trials": records}, indent=1))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    failed = [f"{r['scenario']}#{r['n']}" for r in records if not r["ok"]]
    print(json.dumps({"startup_s": startup, "scenarios": {row[0]: dict(zip(COLUMNS[1:], row[1:])) for row in rows},
                      "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
