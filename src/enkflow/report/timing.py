"""Time-to-solution accounting from an experiment's event log (``enkflow report``).

Per cycle (seconds, from ``events.jsonl``):

``total``     cycle start (before the first job is submitted) to cycle end
              (the driver saw the analysis confirmed and cancelled leftover jobs).
``queuing``   time within the cycle when none of the study's jobs was running:
              the experiment was waiting for the batch queue (a pilot that spans
              cycles counts as running in every cycle it lives through).
``running``   time when a member forecast (including the model's own restart
              I/O) or the analysis computation was running.
``io``        the analysis task's restart I/O: reading the ensemble, writing the
              updated restarts and the mean/spread output (``read_s + write_s +
              update_s + output_s`` reported by the analysis).
``overhead``  the rest: job start-up, polling, scheduler latency, pilots waiting.

``pilot_idle`` (pilot-seconds, not a share of the total) is the time pilots that span
cycles held their CPUs idle waiting for the cycle's release (``pilot_wait`` events:
mostly the previous cycle's analysis), or waited before leaving idle.

``member_io`` (sum over members of the model's own read and write time) and
``analysis_compute`` are reported beside them. The summary gives mean +- std
over cycles of each figure and of its share of the total, as Zheng et al.
(GMD 2020, Table 2) do.

An online experiment (``[experiment] mode = "online"``: its log has
``online_cycle_end`` events) is reported with the server's own figures instead:

``total``        cycle start to cycle end, as above.
``forecast``     the forecast phase: the first member handed out to the last
                 forecast in (the server waits for runners).
``transfer``     time the server spent receiving and sending member states
                 (the slowest server rank; part of the forecast phase).
``analysis``     the analysis computation.
``runner idle``  time runners waited for a member during the forecast phase,
                 summed over runners.
``tasks``        members handed out; ``recomputed`` of them ran a member again
                 (a runner lost, late, failed or rejected, or the statelessness
                 check); ``recovered`` forecasts were read back from the
                 checkpoints of a restarted server instead of being run again.

Its warnings list every rescheduled member (with the cause), server restarts,
replaced runner processes and the messages the server refused.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enkflow.experiment.directory import ExperimentDir
from enkflow.jobs.events import iter_events
from enkflow.jobs.worker import COMPUTE_KEYS, io_seconds
from enkflow.report.expdir import find_expdir
from enkflow.report.incidents import Failure, failure, online_warnings, warnings

FIGURES = ("total", "queuing", "running", "io", "overhead")
ONLINE_FIGURES = ("total", "forecast", "transfer", "analysis", "runner_idle")


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]``."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total = 0.0
    cur_a = cur_b = None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


@dataclass
class CycleTiming:
    """Figures of one cycle, seconds; ``members`` holds per-member records."""

    cycle: int
    total: float
    queuing: float
    running: float
    io: float
    overhead: float
    member_io: float
    analysis_compute: float
    jobs: int
    failures: int
    requeues: int
    members: dict[int, dict[str, Any]] = field(default_factory=dict)
    analysis: dict[str, Any] = field(default_factory=dict)  # seconds, ratios; per-rank lists
    pilot_idle: float = 0.0  # pilot-seconds


@dataclass
class OnlineCycleTiming:
    """Figures of one cycle of an online experiment, seconds (see the module docstring).

    ``diagnostics`` holds the rest of the server's ``online_cycle_end`` event
    (``n_obs``, ``omb_rms``, ``oma_rms``, ``runners``, ``redone_<cause>``, ...);
    ``members`` per-member records (attempts, runner, wait and forecast seconds).
    """

    cycle: int
    total: float
    forecast: float
    transfer: float
    analysis: float
    runner_idle: float
    checkpoint_wait: float
    tasks: int
    recomputed: int
    recovered: int
    requeues: int
    members: dict[int, dict[str, Any]] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Every finished cycle of an experiment, with mean and std over cycles.

    ``mode`` is ``"offline"`` (``cycles`` are :class:`CycleTiming`) or ``"online"``
    (:class:`OnlineCycleTiming`; ``runners`` and ``ranks`` as started); ``failure`` why a failed run stopped.
    """

    expdir: Path
    cycles: list[Any]
    strategy: str = ""
    launcher: str = ""
    warnings: list[str] = field(default_factory=list)
    mode: str = "offline"
    runners: int | None = None
    ranks: int | None = None
    failure: Failure | None = None  # why the run stopped, where it failed

    def summary(self) -> dict[str, dict[str, float | None]]:
        """``{figure: {mean, std, pct_mean, pct_std}}`` over cycles (std is the sample std; 0 for one cycle).
        Online, runner idle time is summed over runners: it has no share of the total (None)."""
        out: dict[str, dict[str, float | None]] = {}
        for name in ONLINE_FIGURES if self.mode == "online" else FIGURES:
            vals = [getattr(c, name) for c in self.cycles]
            pcts = [100.0 * getattr(c, name) / c.total if c.total > 0 else 0.0 for c in self.cycles]
            out[name] = {
                "mean": statistics.fmean(vals) if vals else math.nan,
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "pct_mean": statistics.fmean(pcts) if pcts else math.nan,
                "pct_std": statistics.stdev(pcts) if len(pcts) > 1 else 0.0,
            }
            if name == "runner_idle":
                out[name].update(pct_mean=None, pct_std=None)
        return out


def _by_cycle(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The events that name a cycle, grouped by it, in log order."""
    by_cycle: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if "cycle" in e and isinstance(e["cycle"], int):
            by_cycle.setdefault(e["cycle"], []).append(e)
    return by_cycle


def cycle_timings(events: list[dict[str, Any]]) -> list[CycleTiming]:
    """The figures of every cycle that has a ``cycle_end`` event."""
    by_cycle = _by_cycle(events)
    bounds: dict[int, tuple[float, float]] = {}
    for k in sorted(by_cycle):
        ev = by_cycle[k]
        starts = [e["t"] for e in ev if e["event"] in ("cycle_start", "cycle_resume")]
        ends = [e["t"] for e in ev if e["event"] == "cycle_end"]
        if starts and ends:
            bounds[k] = (min(starts), max(ends))
    job_iv = _job_intervals(events, bounds)
    return [_one_cycle(k, by_cycle[k], lo, hi, job_iv) for k, (lo, hi) in bounds.items()]


def _job_intervals(events: list[dict[str, Any]], bounds: dict[int, tuple[float, float]]) -> list[tuple[float, float]]:
    """Every job's running interval: job_start .. job_end, or .. the moment its death was noticed,
    or else .. the end of the last cycle it was seen in (a job may span cycles)."""
    job_start: dict[str, float] = {}
    job_end: dict[str, float] = {}
    last_cycle: dict[str, int] = {}
    for e in events:
        job = str(e.get("job", ""))
        if job and isinstance(e.get("cycle"), int):
            last_cycle[job] = e["cycle"]
        if e["event"] == "job_start" and job:
            job_start.setdefault(job, e["t"])
        elif e["event"] == "job_end" and job:
            job_end[job] = e["t"]
        elif e["event"] == "task_requeue" and e.get("reason") == "stale":
            j = str((e.get("claim") or {}).get("job", ""))
            if j:
                job_end.setdefault(j, e["t"])
    out = []
    for j, t in job_start.items():
        end = job_end.get(j)
        if end is None:
            end = bounds.get(last_cycle.get(j, -1), (t, t))[1]
        out.append((t, end))
    return out


def _one_cycle(k: int, ev: list[dict[str, Any]], lo: float, hi: float, job_iv: list[tuple[float, float]]) -> CycleTiming:
    busy = _union_length(job_iv, lo, hi)

    # Task intervals: task_start .. the same worker's next end, failure or requeue of that task.
    open_: dict[tuple[int, str], float] = {}
    task_iv: list[tuple[float, float]] = []
    members: dict[int, dict[str, Any]] = {}
    analysis: dict[str, Any] = {}
    failures = requeues = 0
    for e in sorted(ev, key=lambda x: x["t"]):
        name = e["event"]
        task = e.get("task")
        if name == "task_start":
            open_[(task, e.get("worker", ""))] = e["t"]
            if e.get("member") is not None:
                m = members.setdefault(e["member"], {"attempts": 0, "first_start": e["t"]})
                m["attempts"] += 1
        elif name in ("task_end", "task_fail", "task_requeue"):
            worker = e.get("worker") or (e.get("claim") or {}).get("worker", "")
            t0 = open_.pop((task, worker), None)
            if t0 is not None:
                task_iv.append((t0, e["t"]))
            if name == "task_fail":
                failures += 1
            if name == "task_requeue":
                requeues += 1
            if name == "task_end":
                if e.get("member") is not None:
                    m = members.setdefault(e["member"], {"attempts": 1, "first_start": e.get("t_start", e["t"])})
                    m.update(run_s=e.get("run_s", 0.0), io_s=e.get("io_s", 0.0), worker=e.get("worker"), end=e["t"])
                else:
                    analysis = {kk: [float(x) for x in v] if isinstance(v, list) else float(v)
                                for kk, v in (e.get("timings") or {}).items()}
                    analysis["run_s"] = float(e.get("run_s", 0.0))
    for m in members.values():
        m["wait_s"] = m.pop("first_start") - lo
    running_all = _union_length(task_iv, lo, hi)
    io = io_seconds(analysis)
    running = max(0.0, running_all - io)
    total = hi - lo
    queuing = max(0.0, total - busy)
    overhead = max(0.0, total - queuing - running - io)
    n_jobs = len({str(e.get("job")) for e in ev if e["event"] == "job_submit"})
    return CycleTiming(
        cycle=k, total=total, queuing=queuing, running=running, io=io, overhead=overhead,
        member_io=sum(float(m.get("io_s", 0.0)) for m in members.values()),
        analysis_compute=(sum(analysis.get(x, 0.0) for x in COMPUTE_KEYS) if any(x in analysis for x in COMPUTE_KEYS)
                          else max(0.0, analysis.get("run_s", 0.0) - io)),
        jobs=n_jobs, failures=failures, requeues=requeues, members=members, analysis=analysis,
        pilot_idle=sum(float(e.get("idle_s", 0.0)) for e in ev if e["event"] == "pilot_wait"),
    )


def is_online(events: list[dict[str, Any]]) -> bool:
    """Whether the log is an online experiment's (its server or its supervisor wrote it)."""
    return any(e["event"] in ("online_cycle_end", "online_start") or
               (e["event"] == "experiment_start" and e.get("mode") == "online") for e in events)


def online_cycle_timings(events: list[dict[str, Any]]) -> list[OnlineCycleTiming]:
    """The figures of every cycle of an online experiment that has an ``online_cycle_end`` event
    (the last one, should a restarted server have analysed a cycle again)."""
    by_cycle = _by_cycle(events)
    result = []
    for k in sorted(by_cycle):
        ev = by_cycle[k]
        ends = [e for e in ev if e["event"] == "online_cycle_end"]
        if not ends:
            continue
        d = ends[-1]
        starts = [e["t"] for e in ev if e["event"] == "cycle_start"] or [d["t"] - float(d.get("forecast_s", 0.0))]
        stops = [e["t"] for e in ev if e["event"] == "cycle_end"] or [d["t"]]
        lo, hi = min(starts), max(stops)

        def num(key: str) -> float:
            v = d.get(key, 0.0)
            return float(v) if isinstance(v, (int, float)) else 0.0

        known = {"t", "event", "pid", "cycle", "forecast_s", "transfer_s", "analysis_s", "runner_idle_s",
                 "checkpoint_wait_s", "tasks", "recomputed", "recovered"}
        result.append(OnlineCycleTiming(
            cycle=k, total=hi - lo, forecast=num("forecast_s"), transfer=num("transfer_s"), analysis=num("analysis_s"),
            runner_idle=num("runner_idle_s"), checkpoint_wait=num("checkpoint_wait_s"), tasks=int(num("tasks")),
            recomputed=int(num("recomputed")), recovered=int(num("recovered")),
            requeues=sum(1 for e in ev if e["event"] == "task_requeue"),
            members=_online_members(ev, lo), diagnostics={kk: v for kk, v in d.items() if kk not in known},
        ))
    return result


def _online_members(ev: list[dict[str, Any]], lo: float) -> dict[int, dict[str, Any]]:
    """Per member: attempts (tasks handed out), the runner whose forecast counted, the wait from the
    cycle start to the first hand-out and the forecast seconds (hand-out to forecast in) of that task."""
    assigned: dict[Any, dict[str, Any]] = {}
    members: dict[int, dict[str, Any]] = {}
    for e in sorted(ev, key=lambda x: x["t"]):
        m = e.get("member")
        if not isinstance(m, int):
            continue
        if e["event"] == "task_assign":
            assigned[e.get("task")] = e
            r = members.setdefault(m, {"attempts": 0, "wait_s": e["t"] - lo})
            r["attempts"] += 1
        elif e["event"] == "task_done":
            a = assigned.get(e.get("task"))
            r = members.setdefault(m, {"attempts": 0, "wait_s": 0.0})
            if a is not None:
                r.update(runner=a.get("runner"), run_s=e["t"] - a["t"])
    return members


def load_report(expdir: str | Path) -> Report:
    """The report of the experiment in ``expdir`` (its ``events.jsonl``).

    ``expdir`` may also be an experiment TOML or the directory above the experiment
    directory (see :func:`find_expdir`); the report names the directory it read.
    """
    d = find_expdir(expdir)
    path = ExperimentDir(d).events
    events = list(iter_events(path))
    if is_online(events):
        return _online_report(d, events)
    strategy = launcher = ""
    for e in events:
        if e["event"] in ("experiment_start", "resume"):
            strategy, launcher = e.get("strategy", ""), e.get("launcher", "")
    return Report(d, cycle_timings(events), strategy, launcher, warnings(events), failure=failure(events))


def _online_report(d: Path, events: list[dict[str, Any]]) -> Report:
    launcher = ""
    runners = ranks = None
    for e in events:
        if e["event"] == "experiment_start":
            launcher = e.get("launcher", launcher)
            runners, ranks = e.get("runners", runners), e.get("ranks", ranks)
        elif e["event"] == "online_start" and ranks is None:
            ranks = e.get("ranks")
    if runners is None:  # a server started by hand (enkflow serve): the runners that joined
        runners = len({e.get("runner") for e in events if e["event"] == "runner_join"})
    return Report(d, online_cycle_timings(events), "", launcher, online_warnings(events), mode="online",
                  runners=runners, ranks=ranks, failure=failure(events))

