"""A queue model of benchmarks/table2.py: what the three strategies' times are expected to be.

The real benchmark runs a real SLURM for an hour and still estimates each
strategy's mean total to only ~+-8% (a cycle's total varies by ~25% under
load). This model simulates the same node for hundreds of cycles in a few
minutes, so it separates the scheme's expected ratios from run-to-run noise
and shows how they depend on the background load:

* one node of ``--node-cpus`` CPUs; SLURM's ``priority/basic`` FIFO order plus
  EASY backfill from time limits (``sched/backfill``); a dependent job ranks
  from its eligible time (``LocalSlurm(queue="eligible")``);
* the load of ``BackgroundLoad`` (its own ``draw``): ``--load-jobs`` one-CPU
  jobs kept queued or running, durations uniform or log-uniform, time limit
  rounded up to a minute;
* the strategies' work as measured on the real one: a member 6.4 s (6 s of
  model plus its I/O and start), the analysis 1.6 s, the all-resources job
  9 s (its eight members share two real cores); experiment jobs ask 10 min.

Cycles run back to back with the strategies' order rotating, as in table2.py.

    .venv/bin/python benchmarks/table2_model.py            # the benchmark's default load
    .venv/bin/python benchmarks/table2_model.py --sweep    # several load laws side by side
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

# The local SLURM harness (enkflow_testing.localslurm) lives outside the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))

from enkflow_testing.localslurm import BackgroundLoad  # noqa: E402

DT = 0.1  # time step, s
STRATEGIES = ("dynamic", "dynamic-cycle", "per-member", "single")


class Job:
    def __init__(self, kind: str, cpus: int, duration: float, limit: float, rank: int):
        self.kind, self.cpus, self.duration, self.limit, self.rank = kind, cpus, duration, limit, rank
        self.start: float | None = None


class Node:
    """One node under FIFO + EASY backfill, advanced in steps of ``dt`` seconds."""

    def __init__(self, cpus: int, dt: float = DT):
        self.cpus, self.dt = cpus, dt
        self.t = 0.0
        self.queue: list[Job] = []
        self.running: list[Job] = []
        self.used = 0  # CPUs of the running jobs
        self._rank = 0

    def submit(self, kind: str, cpus: int, duration: float, limit: float) -> Job:
        self._rank += 1
        job = Job(kind, cpus, duration, limit, self._rank)
        self.queue.append(job)
        return job

    def free(self) -> int:
        return self.cpus - self.used

    def _start(self, job: Job) -> None:
        self.queue.remove(job)
        job.start = self.t
        self.running.append(job)
        self.used += job.cpus

    def schedule(self) -> None:
        self.queue.sort(key=lambda j: j.rank)
        reserved_at = None
        for job in list(self.queue):
            if reserved_at is None:
                if job.cpus <= self.free():
                    self._start(job)
                    continue
                # The first job that does not fit gets a reservation from the running jobs' limits.
                need = job.cpus - self.free()
                for end in sorted(r.start + r.limit for r in self.running):
                    need -= 1
                    reserved_at = end
                    if need <= 0:
                        break
            elif job.cpus <= self.free() and self.t + job.limit <= reserved_at:
                self._start(job)

    def cancel(self, job: Job) -> None:
        if job in self.queue:
            self.queue.remove(job)
        elif job in self.running:
            self.running.remove(job)
            self.used -= job.cpus

    def step(self) -> list[Job]:
        self.t += self.dt
        done = [j for j in self.running if self.t - j.start >= j.duration]
        if done:
            ended = set(done)
            self.running = [j for j in self.running if j not in ended]
            self.used -= sum(j.cpus for j in done)
        return done


class Load:
    """BackgroundLoad's law: ``jobs`` one-CPU jobs kept queued or running."""

    def __init__(self, node: Node, jobs: int, seconds: tuple[float, float], law: str, rng: random.Random):
        self.node, self.jobs, self.seconds, self.law, self.rng = node, jobs, seconds, law, rng

    def top_up(self) -> None:
        n = sum(1 for j in self.node.queue + self.node.running if j.kind == "load")
        for _ in range(self.jobs - n):
            secs, limit_min = BackgroundLoad.draw(self.rng, self.seconds, self.law)
            self.node.submit("load", 1, secs, 60.0 * limit_min)


class Study:
    """One strategy's study on the node, cycle after cycle (the pilots of ``dynamic`` outlive a cycle)."""

    def __init__(self, node: Node, load: Load, strategy: str, *, members: int, member_s: float, analysis_s: float,
                 single_s: float, idle_timeout_s: float, limit_s: float = 600.0):
        self.node, self.load, self.strategy = node, load, strategy
        self.members, self.member_s, self.analysis_s, self.single_s = members, member_s, analysis_s, single_s
        self.idle_timeout_s, self.limit_s = idle_timeout_s, limit_s
        self.pilots: list[Job] = []  # live pilots (queued or running)
        self.idle_since: dict[Job, float] = {}
        self.pilot_idle = 0.0  # pilot-seconds held idle

    def tick(self) -> list[Job]:
        self.load.top_up()
        self.node.schedule()
        return self.node.step()

    def cycle(self, last: bool) -> float:
        """One cycle; returns its total, s."""
        t0 = self.node.t
        if self.strategy == "single":
            job = self.node.submit("exp", self.members, self.single_s, self.limit_s)
            while job not in self.tick():
                pass
        elif self.strategy == "per-member":
            pending = {self.node.submit("exp", 1, self.member_s, self.limit_s) for _ in range(self.members)}
            while pending:
                pending -= set(self.tick())
            job = self.node.submit("exp", 1, self.analysis_s, self.limit_s)  # dependent job: ranks from now
            while job not in self.tick():
                pass
        else:
            self._pilots_cycle(spans=self.strategy == "dynamic", last=last)
        return self.node.t - t0

    def _top_up(self, n: int) -> None:
        self.pilots += [self.node.submit("pilot", 1, math.inf, self.limit_s) for _ in range(n - len(self.pilots))]

    def _pilots_cycle(self, *, spans: bool, last: bool) -> None:
        """Pilots pull members from the to-do list; a running pilot takes the analysis last. Pilots of
        one cycle (``dynamic-cycle``) leave at its end; pilots that span cycles wait (leaving once idle
        longer than the timeout), and the next cycle's missing pilots are submitted when the analysis starts."""
        self._top_up(self.members)
        todo, done, busy_until = self.members, 0, {}
        while done < self.members:
            self.tick()
            for p in list(self.pilots):
                if p.start is None:
                    continue
                if p in busy_until and self.node.t >= busy_until[p]:
                    del busy_until[p]
                    done += 1
                    self.idle_since[p] = self.node.t
                if p not in busy_until and todo:
                    todo -= 1
                    busy_until[p] = self.node.t + self.member_s
                    self.pilot_idle += self.node.t - self.idle_since.pop(p, self.node.t)
                elif p not in busy_until:
                    self._leave_if_idle(p)
        if spans and not last:
            self._top_up(self.members)  # submitted ahead: they queue while the analysis runs
        analysis_end = self.node.t + self.analysis_s
        while self.node.t < analysis_end:
            self.tick()
            for p in list(self.pilots):
                if p.start is not None:
                    self._leave_if_idle(p)
        if not spans or last:
            for p in self.pilots:  # queued pilots are cancelled, idle running ones leave
                if p.start is not None:
                    self.pilot_idle += self.node.t - self.idle_since.pop(p, p.start)
                self.node.cancel(p)
            self.pilots = []

    def _leave_if_idle(self, p: Job) -> None:
        since = self.idle_since.setdefault(p, p.start)
        if self.node.t - since > self.idle_timeout_s:
            self.pilot_idle += self.node.t - since
            self.node.cancel(p)
            self.pilots.remove(p)
            del self.idle_since[p]


def simulate(*, cycles: int, node_cpus: int, load_jobs: int, seconds: tuple[float, float], law: str, seed: int,
             members: int = 8, member_s: float = 6.4, analysis_s: float = 1.6, single_s: float = 9.0,
             idle_timeout_s: float = 120.0, dt: float = DT) -> dict[str, dict]:
    """Every strategy's study of ``cycles`` cycles, one after another on one node under the load: per
    strategy the cycles' totals (s) and the pilots' idle pilot-seconds per cycle."""
    rng = random.Random(seed)
    node = Node(node_cpus, dt)
    load = Load(node, load_jobs, seconds, law, rng)
    while node.t < max(seconds):  # steady state first, as table2.py waits
        load.top_up()
        node.schedule()
        node.step()
    out: dict[str, dict] = {}
    for strategy in STRATEGIES:
        study = Study(node, load, strategy, members=members, member_s=member_s, analysis_s=analysis_s,
                      single_s=single_s, idle_timeout_s=idle_timeout_s)
        totals = [study.cycle(last=k == cycles - 1) for k in range(cycles)]
        out[strategy] = {"totals": totals, "pilot_idle": study.pilot_idle / cycles}
    return out


def describe(result: dict[str, dict]) -> str:
    totals = {s: r["totals"] for s, r in result.items()}
    m = {s: statistics.mean(v) for s, v in totals.items()}
    sd = {s: statistics.stdev(v) for s, v in totals.items()}
    n = len(totals["dynamic"])

    def ratio(a: str, b: str) -> str:
        r = m[a] / m[b]
        se = r * math.sqrt((sd[a] / m[a]) ** 2 + (sd[b] / m[b]) ** 2) / math.sqrt(n)
        return f"{r:.2f} +- {se:.2f}"

    cells = ", ".join(f"{s} {m[s]:6.1f} +- {sd[s]:5.1f}" for s in STRATEGIES)
    return (f"{cells} s | dynamic/single {ratio('dynamic', 'single')}, dynamic/per-member "
            f"{ratio('dynamic', 'per-member')}, dynamic/previous {ratio('dynamic', 'dynamic-cycle')}; pilots idle "
            f"{result['dynamic']['pilot_idle']:.1f} pilot-s per cycle")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=300, help="cycles per strategy (default 300)")
    ap.add_argument("--members", type=int, default=8, help="N_e (default 8, as table2.py)")
    ap.add_argument("--node-cpus", type=int, default=16, help="CPUs of the node (or of the cluster, as one pool)")
    ap.add_argument("--load-jobs", type=int, default=24)
    ap.add_argument("--load-seconds", type=float, nargs=2, default=(5.0, 300.0))
    ap.add_argument("--load-distribution", choices=["loguniform", "uniform"], default="loguniform")
    ap.add_argument("--idle-timeout", type=float, default=120.0, help="[jobs] idle_timeout of the pilots, s")
    ap.add_argument("--member-seconds", type=float, default=6.4, help="one member's forecast, s (as measured on table2.py)")
    ap.add_argument("--analysis-seconds", type=float, default=1.6, help="the analysis, s")
    ap.add_argument("--dt", type=float, default=DT, help=f"time step, s (default {DT}; 1 for thousands of jobs)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sweep", action="store_true", help="the load laws compared in the closing note of issue 4")
    args = ap.parse_args()
    cases = [(args.load_distribution, tuple(args.load_seconds), args.load_jobs)]
    if args.sweep:
        cases = [("loguniform", (5.0, 300.0), args.load_jobs), ("uniform", (30.0, 600.0), args.load_jobs),
                 ("loguniform", (10.0, 120.0), args.load_jobs), ("uniform", (20.0, 60.0), args.load_jobs)]
    print(f"(+- after a mean: std of one cycle; after a ratio: standard error over {args.cycles} cycles)")
    for law, seconds, jobs in cases:
        result = simulate(cycles=args.cycles, node_cpus=args.node_cpus, load_jobs=jobs, seconds=seconds, law=law,
                          seed=args.seed, members=args.members, idle_timeout_s=args.idle_timeout,
                          member_s=args.member_seconds, analysis_s=args.analysis_seconds,
                          single_s=args.member_seconds + 2.6, dt=args.dt)
        print(f"{law:10} {seconds[0]:g}-{seconds[1]:g} s, {jobs} jobs: {describe(result)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
