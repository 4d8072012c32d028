"""Fault trials of the offline cycle with the built-in analysis: does every kill end bitwise equal?

Claim under test (docs/io.md, docs/jobs.md): after a SIGKILL at any moment (of the analysis task,
a pilot worker, the driver, or all of them) and a rerun of ``enkflow run``, the member restarts
are bitwise equal to those of the fault-free run.

1. A fault-free reference run (tiny synthetic land problem, 4 members, 2 pilots, LETKF with
   the crash-safe update through shadow files, the default), then a traced fault-free run: every call of the
   write/rename/unlink/fsync family (``enkflow_testing.faults.FAMILY``) that one cycle's analysis
   task makes, in order.
2. One trial per such call: the analysis is SIGKILLed by strace on entering that call (first
   attempt only; the job scheme's retry runs clean); the experiment runs to its end.
3. ``--kills`` trials killing the driver, a pilot or the whole process tree at random moments
   (uniform over the run, inside an analysis, right after an analysis exited), then resuming.

Every trial prints: the kill point, whether the planned call was the one hit, the analysis
attempts per cycle, whether the final analysis' omb_rms is the reference's (a double analysis
makes the retry's omb_rms the first attempt's oma_rms), and the outcome (bitwise equal /
differs / error). Ends with one JSON line.

usage: python benchmarks/fault_trials.py [--src DIR] [--cycles 2] [--kills 24] [--seed 0]
                                         [--syscalls all|I,J,..] [--work DIR] [--keep]

``--src`` tests another checkout's ``src`` (PYTHONPATH; e.g. a ``git worktree`` of an older commit,
with the compiled ``enkflow/analysis/_lanes*.so`` copied or built there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The fault harness (enkflow_testing.faults) lives outside the installed package.
sys.path.insert(0, str(ROOT / "testing"))

from enkflow_testing.gitinfo import code_version  # noqa: E402

TARGETS = ("driver", "pilot", "tree")
MOMENTS = ("time", "analysis", "after-analysis")


def _groups(calls) -> list[str]:
    """Consecutive calls of one name on one path, as one line."""
    out: list[str] = []
    run: list = []

    def flush() -> None:
        if run:
            base = run[0].desc.rsplit(" #", 1)[0]
            rng = f"{run[0].index}" if len(run) == 1 else f"{run[0].index}-{run[-1].index}"
            out.append(f"  {rng:>7}  {len(run):>3} x {base}")

    for c in calls:
        if run and c.desc.rsplit(" #", 1)[0] == run[-1].desc.rsplit(" #", 1)[0]:
            run.append(c)
        else:
            flush()
            run = [c]
    flush()
    return out


def _section(results) -> dict:
    return {"n": len(results), "equal": sum(r.outcome == "equal" for r in results),
            "differs": sum(r.outcome == "differs" for r in results), "error": sum(r.outcome == "error" for r in results)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=None, help="the enkflow src/ to test (default: the installed one)")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--inject-cycle", type=int, default=None, help="cycle whose analysis is killed (default: the last)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kills", type=int, default=24, help="random kills of driver / pilot / process tree")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--syscalls", default="all", help="'all', 'none', or call indices (0-based, comma-separated)")
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)

    from enkflow_testing import faults

    t_start = time.perf_counter()
    reason = faults.strace_missing_reason()
    if reason and a.syscalls != "none":
        print(f"syscall trials impossible: {reason}")
        return 2
    env = dict(os.environ)
    src = a.src.resolve() if a.src else Path(__import__("enkflow").__file__).resolve().parents[1]
    if a.src:
        env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    version = code_version(src)
    work = a.work or Path(tempfile.mkdtemp(prefix="enkflow-faults-"))
    inject_cycle = a.inject_cycle or a.cycles
    strace_v = subprocess.run(["strace", "-V"], capture_output=True, text=True).stdout.splitlines()[0] if not reason else "-"
    print(f"code under test: {src} ({version}); {strace_v}; work dir {work}")
    print(f"experiment: tiny synthetic land problem, {a.members} members, {a.cycles} cycles, {a.workers} pilots, "
          f"built-in LETKF analysis (crash-safe update: shadow files)")
    h = faults.FaultHarness(work, members=a.members, cycles=a.cycles, workers=a.workers, env=env, say=print)
    t0 = time.perf_counter()
    ref = h.reference()
    print(f"fault-free reference run: {ref.seconds:.1f} s; analysis run time per cycle "
          + ", ".join(f"{k}: {v:.2f} s" for k, v in sorted(ref.analysis_s.items())))

    results: list = []
    sys_results: list = []
    plan_info: dict = {}
    if a.syscalls != "none":
        t1 = time.perf_counter()
        tr = h.trace(inject_cycle)
        counts = Counter(c.name for c in tr.calls)
        plan = faults.plan_injections(tr)
        plan_info = {"calls": len(tr.calls), "counts": dict(counts), "exact": sum(p.exact for p in plan)}
        print(f"\ntraced fault-free run ({time.perf_counter() - t1:.1f} s): cycle {inject_cycle}'s analysis made "
              f"{len(tr.calls)} calls of the family: "
              + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
        print(f"(threads/processes: {len({c.tid for c in tr.calls})}; "
              f"{plan_info['exact']}/{len(plan)} calls can be selected exactly by strace's per-thread counting)")
        print("\n".join(_groups(tr.calls)))
        idx = range(len(plan)) if a.syscalls == "all" else [int(x) for x in a.syscalls.split(",")]
        print(f"\nsyscall trials ({len(idx)}): SIGKILL of cycle {inject_cycle}'s analysis on entering the call")
        print(faults.format_table([]))
        for i in idx:
            r = h.syscall_trial(len(results) + 1, plan[i], inject_cycle)
            results.append(r)
            sys_results.append(r)
            print("\n".join(faults.format_table([r]).splitlines()[1:]), flush=True)
        print(f"syscall trials: {faults.summary_line(sys_results)}")

    kill_results: list = []
    if a.kills:
        rng = random.Random(a.seed)
        print(f"\nrandom kills ({a.kills}, seed {a.seed}): SIGKILL, then `enkflow run` again until it finishes")
        print(faults.format_table([]))
        for i in range(a.kills):
            target = TARGETS[i % 3]
            moment = MOMENTS[(i // 3) % 3]
            r = h.kill_trial(len(results) + 1, target, moment, rng)
            results.append(r)
            kill_results.append(r)
            print("\n".join(faults.format_table([r]).splitlines()[1:]), flush=True)
        print(f"kill trials: {faults.summary_line(kill_results)}")

    total = time.perf_counter() - t_start
    print(f"\nall trials ({version}): {faults.summary_line(results)}; {total / 60:.1f} min "
          f"(reference and setup {time.perf_counter() - t0 - sum(r.seconds for r in results):.0f} s)")
    bad = [r for r in results if r.outcome != "equal"]
    for r in bad:
        print(f"  not equal: #{r.n} {r.kind} {r.where}: {r.outcome} {r.detail}")
    if not a.keep and not bad and a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "benchmark": "fault_trials", "code": version, "src": str(src), "cycles": a.cycles, "inject_cycle": inject_cycle,
        "members": a.members, "reference_s": ref.seconds, "syscalls": plan_info,
        "syscall_trials": _section(sys_results), "kill_trials": _section(kill_results),
        "not_equal": [[r.n, r.kind, r.where if r.call is None else f"[{r.call}] {r.where}", r.outcome] for r in bad],
        "seconds": total,
    }))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
