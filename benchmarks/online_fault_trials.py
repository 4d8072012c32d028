"""Fault trials of the online mode: do runner and server failures leave the results bitwise equal,
and is only the work in flight at the failure redone?

Claim under test (acceptance criterion 4 of the online mode): a runner killed (SIGKILL) or hung
(SIGSTOP, continued later or never) mid-forecast, the server killed (SIGKILL) during the forecasts
before any of the cycle's forecasts was checkpointed, after some were, or inside the analysis, and a
runner joining while another leaves (SIGTERM) mid-cycle all end with ``enkflow run`` exiting 0, the
final member restarts and every cycle's analysis mean and spread bitwise equal to the fault-free
run's, and no forecast recomputed but those in flight at the failure (for a server kill: plus those
accepted but not yet checkpointed; never one checkpointed before the kill).

The experiment: the online demo (tiny synthetic land problem, LETKF), 8 members, 3 cycles, 3 demo
runners idling ``--sleep`` seconds per forecast, heartbeat 0.2 s, heartbeat timeout 1 s, due floor 5 s.
``--trials`` trials per scenario, interleaved, each at a random moment with a random victim
(``testing/enkflow_testing/online_faults.py`` describes the scenarios and how the moments are hit).
Prints one line per trial, a summary per scenario (trials, bitwise equal, exit 0, recomputed
forecasts mean/max against those in flight at the failure), and ends with one JSON line
(``--json``: only that line).

usage: python benchmarks/online_fault_trials.py [--trials 20] [--seed 0] [--scenarios all|S,S..]
                                                [--sleep 0.3] [--src DIR] [--work DIR] [--keep] [--json]

``--src`` runs the experiment with another checkout's ``src`` (PYTHONPATH of ``enkflow run``, e.g. a
``git worktree`` of an older commit with ``enkflow/analysis/_lanes*.so`` copied in); the harness itself
(the demo problem, the comparisons) uses the installed enkflow.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The fault harness (enkflow_testing.online_faults) lives outside the installed package.
sys.path.insert(0, str(ROOT / "testing"))

from enkflow_testing.gitinfo import code_version  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from enkflow_testing import online_faults as of
    from enkflow_testing.faults import strace_missing_reason

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per scenario")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", default="all", help=f"'all' or a comma-separated list of {', '.join(of.SCENARIOS)}")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--runners", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=0.3, help="runner idle seconds per forecast")
    ap.add_argument("--src", type=Path, default=None, help="the enkflow src/ to test (default: the installed one)")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--json", action="store_true", help="print only the final JSON line")
    a = ap.parse_args(argv)
    say = (lambda _m: None) if a.json else (lambda m: print(m, flush=True))

    scenarios = list(of.SCENARIOS) if a.scenarios == "all" else a.scenarios.split(",")
    for s in scenarios:
        if s not in of.SCENARIOS:
            ap.error(f"unknown scenario {s!r}; one of {', '.join(of.SCENARIOS)}")
    skipped: dict[str, str] = {}
    why = strace_missing_reason(install=True) if "server-analysis" in scenarios else None
    if why:
        skipped["server-analysis"] = why
        scenarios.remove("server-analysis")
        say(f"server-analysis skipped: {why}")
    t_start = time.perf_counter()
    env = dict(os.environ)
    src = a.src.resolve() if a.src else Path(__import__("enkflow").__file__).resolve().parents[1]
    if a.src:
        env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    version = code_version(src)
    work = a.work or Path(tempfile.mkdtemp(prefix="enkflow-online-faults-"))
    h = of.OnlineFaultHarness(work, members=a.members, cycles=a.cycles, runners=a.runners, sleep=a.sleep, env=env, say=say)
    say(f"code under test: {src} ({version}); work dir {work}")
    say(f"experiment: online demo, tiny synthetic land problem, LETKF, {a.members} members, {a.cycles} cycles, "
        f"{a.runners} runners idling {a.sleep:g} s per forecast; heartbeat {h.heartbeat:g} s, timeout "
        f"{h.heartbeat_timeout:g} s, due floor {h.due_floor:g} s")
    ref = h.reference()
    say(f"fault-free reference run: {ref.seconds:.1f} s, {ref.tasks} forecasts assigned "
        f"({a.members} x {a.cycles} + the statelessness check's repeat run)")
    rng = random.Random(a.seed)
    results = []
    say(f"\n{a.trials} trials per scenario, seed {a.seed}\n" + of.format_table([]))
    n = 0
    for i in range(a.trials):
        for s in scenarios:
            n += 1
            variant = ("cont", "left")[i % 2] if s == "runner-stop" else None
            r = h.trial(n, s, rng, variant=variant)
            results.append(r)
            say("\n".join(of.format_table([r]).splitlines()[1:]))

    summary = of.summarize(results)
    total = time.perf_counter() - t_start
    say(f"\nsummary ({version}, {total / 60:.1f} min); 'in flight' = forecasts interrupted by the fault "
        "(+ accepted but not yet checkpointed, for server kills)")
    say(f"{'scenario':<20} {'trials':>6} {'equal':>6} {'exit 0':>6} {'recomputed mean/max':>20} "
        f"{'in flight mean/max':>19} {'redo=flight':>11} {'redo<=flight':>12} {'ckpt redone':>11}")
    for s, d in summary.items():
        rs = [r for r in results if r.scenario == s]
        eq_flight = sum(r.recomputed == r.expected for r in rs)
        say(f"{s:<20} {d['trials']:>6} {d['equal']:>6} {d['exit0']:>6} "
            f"{d['recomputed_mean']:>14.2f} / {d['recomputed_max']:<3} {d['in_flight_mean']:>13.2f} / {d['in_flight_max']:<3} "
            f"{eq_flight:>11} {d['recompute_as_in_flight']:>12} {d['redone_checkpointed']:>11}")
        d["recomputed_eq_in_flight"] = eq_flight
    points = Counter(r.where.split(": ", 1)[1].split(" (")[0] for r in results if r.scenario == "server-analysis")
    if points:
        say("server-analysis kill points: " + ", ".join(f"{p} {c}" for p, c in sorted(points.items())))
        summary["server-analysis"]["points"] = dict(points)
    bad = [r for r in results if r.outcome != "equal" or r.rc != 0 or not r.recompute_ok or not r.injected]
    for r in bad:
        say(f"  not as claimed: #{r.n} {r.scenario} {r.where}: {r.outcome} rc={r.rc} recomputed {r.recomputed} "
            f"in flight {r.expected} injected={r.injected} {r.detail}")
    if not a.keep and not bad and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "benchmark": "online_fault_trials", "code": version, "src": str(src), "members": a.members, "cycles": a.cycles,
        "runners": a.runners, "sleep_s": a.sleep, "heartbeat_s": h.heartbeat, "heartbeat_timeout_s": h.heartbeat_timeout,
        "reference_s": ref.seconds, "reference_tasks": ref.tasks, "seed": a.seed, "trials_per_scenario": a.trials,
        "scenarios": summary, "skipped": skipped,
        "not_as_claimed": [[r.n, r.scenario, r.where, r.outcome, r.rc, r.recomputed, r.expected, r.detail] for r in bad],
        "seconds": total,
    }))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
