"""Time-to-solution accounting from an experiment's event log (``enkflow report``).

Per cycle (seconds, from ``events.jsonl``):

``total``     cycle start (before the first job is submitted) to cycle end
              (the driver saw the analysis confirmed and cancelled leftover jobs).
``queuing``   time within the cycle when none of the cycle's jobs was running:
              the experiment was waiting for the batch queue.
``running``   time when a member forecast (including the model's own restart
              I/O) or the analysis computation was running.
``io``        the analysis task's restart I/O: reading the ensemble, writing the
              updated restarts and the mean/spread output (``read_s + write_s +
              update_s + output_s`` reported by the analysis).
``overhead``  the rest: job start-up, polling, scheduler latency.

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

from enkflow.errors import EnkflowError
from enkflow.jobs.events import iter_events
from enkflow.jobs.worker import COMPUTE_KEYS, io_seconds

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
    (:class:`OnlineCycleTiming`; ``runners`` and ``ranks`` as started).
    """

    expdir: Path
    cycles: list[Any]
    strategy: str = ""
    launcher: str = ""
    warnings: list[str] = field(default_factory=list)
    mode: str = "offline"
    runners: int | None = None
    ranks: int | None = None

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
    result = []
    for k in sorted(by_cycle):
        ev = by_cycle[k]
        starts = [e["t"] for e in ev if e["event"] in ("cycle_start", "cycle_resume")]
        ends = [e["t"] for e in ev if e["event"] == "cycle_end"]
        if not starts or not ends:
            continue
        lo, hi = min(starts), max(ends)
        result.append(_one_cycle(k, ev, lo, hi))
    return result


def _one_cycle(k: int, ev: list[dict[str, Any]], lo: float, hi: float) -> CycleTiming:
    # Job running intervals: job_start .. job_end, or .. the moment its death was noticed.
    job_start: dict[str, float] = {}
    job_end: dict[str, float] = {}
    for e in ev:
        job = str(e.get("job", ""))
        if e["event"] == "job_start" and job:
            job_start.setdefault(job, e["t"])
        elif e["event"] == "job_end" and job:
            job_end[job] = e["t"]
        elif e["event"] == "task_requeue" and e.get("reason") == "stale":
            j = str((e.get("claim") or {}).get("job", ""))
            if j:
                job_end.setdefault(j, e["t"])
    job_iv = [(t, job_end.get(j, hi)) for j, t in job_start.items()]
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


EVENTS = "events.jsonl"


def _toml_expdirs(tomls: list[Path]) -> list[Path]:
    """Experiment directories named by experiment TOML files (their ``[experiment] directory``)."""
    import tomllib

    out = []
    for toml in tomls:
        try:
            data = tomllib.loads(toml.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # not an experiment file; the subdirectory scan may still find the run
        exp = data.get("experiment")
        if isinstance(exp, dict):
            # The default and the resolution of enkflow.experiment.config: relative to the TOML's directory.
            sub = Path(str(exp.get("directory", "experiment"))).expanduser()
            out.append(sub if sub.is_absolute() else toml.parent / sub)
    return out


def find_expdir(path: str | Path) -> Path:
    """The experiment directory (holding ``events.jsonl``) that ``path`` means.

    ``path`` is the experiment directory itself, an experiment TOML, or a directory
    above the experiment directory, such as the one ``enkflow demo`` names (it holds
    ``experiment.toml`` and the run directory ``run/``). Raises :class:`EnkflowError`
    naming ``path`` and the directories found, where none or several hold a run.
    """
    p = Path(path)
    if (p / EVENTS).is_file():
        return p
    if p.is_file() and p.suffix == ".toml":
        named = _toml_expdirs([p])
        found = [q for q in named if (q / EVENTS).is_file()]
    elif p.is_dir():
        named = _toml_expdirs(sorted(p.glob("*.toml")))
        found = [q for q in named if (q / EVENTS).is_file()]
        found += [q.parent for q in sorted(p.glob(f"*/{EVENTS}"))]
    else:
        raise EnkflowError(f"{p}: no such experiment directory or file")
    found = list(dict.fromkeys(q.resolve() for q in found))
    if len(found) == 1:
        return found[0]
    if found:
        raise EnkflowError(f"{p}: not an experiment directory, but {len(found)} are below it; "
                           f"give one of: {', '.join(str(q) for q in found)}")
    hint = ""
    if named:
        hint = (f" Its experiment TOML names the experiment directory {', '.join(str(q.resolve()) for q in named)},"
                f" which has no {EVENTS} yet (has `enkflow run` started?)")
    raise EnkflowError(f"{p}: no {EVENTS}; is it an enkflow experiment directory?{hint}")


def load_report(expdir: str | Path) -> Report:
    """The report of the experiment in ``expdir`` (its ``events.jsonl``).

    ``expdir`` may also be an experiment TOML or the directory above the experiment
    directory (see :func:`find_expdir`); the report names the directory it read.
    """
    d = find_expdir(expdir)
    path = d / EVENTS
    events = list(iter_events(path))
    if is_online(events):
        return _online_report(d, events)
    strategy = launcher = ""
    for e in events:
        if e["event"] in ("experiment_start", "resume"):
            strategy, launcher = e.get("strategy", ""), e.get("launcher", "")
    return Report(d, cycle_timings(events), strategy, launcher, warnings(events))


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
                  runners=runners, ranks=ranks)


def warnings(events: list[dict[str, Any]]) -> list[str]:
    """What a user must look at: members whose model exited 0 but left the restart unchanged,
    forecasts rerun from their protected restart."""
    out = []
    for e in events:
        if e["event"] == "task_unchanged":
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: the model exited 0 but left its restart "
                       f"{e.get('restart')} unchanged (command: {' '.join(map(str, e.get('argv', [])))})")
        elif e["event"] == "task_restore":
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: rerun from its protected restart "
                       "(an earlier attempt failed or was killed)")
        elif e["event"] == "archive_fail":
            out.append(_first_line(e.get("error")))
    return out


def _first_line(text: Any, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def online_warnings(events: list[dict[str, Any]]) -> list[str]:
    """An online experiment's: members rescheduled (runner lost, late, failed, left; forecast rejected),
    server restarts, runner processes replaced, failed statelessness checks, the reason the study
    stopped, and a summary of the messages the server refused."""
    out: list[str] = []
    rejects: dict[str, int] = {}
    for e in events:
        name = e["event"]
        if name == "task_requeue":
            err = e.get("error")
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: rescheduled ({e.get('reason')})"
                       + (f": {_first_line(err)}" if err else ""))
        elif name == "server_crash":
            out.append(f"the server exited without finishing; started again from its checkpoints "
                       f"(restart {e.get('restart')})")
        elif name == "online_start" and e.get("resumed"):
            cycles = e.get("cycles") or []
            rec = e.get("recovered_forecasts") or []
            out.append(f"the server resumed from its checkpoints at cycle {cycles[0] if cycles else '?'}"
                       + (f"; {len(rec)} forecast(s) of that cycle recovered, not run again" if rec else ""))
        elif name == "runner_exit":
            out.append(f"runner job {e.get('job')} exited before the study ended; another was started")
        elif name == "stateless_check" and not e.get("ok", True):
            out.append(f"cycle {e.get('cycle')}, member {e.get('member')}: the statelessness check failed: "
                       f"{_first_line(e.get('reason'))}")
        elif name == "experiment_fail":
            why = e.get("reason") or (e.get("report") or {}).get("reason")
            line = f"the study stopped: {_first_line(why)}"
            if line not in out:
                out.append(line)
        elif name == "archive_fail":
            out.append(_first_line(e.get("error")))
        elif name == "online_reject":
            reason = _first_line(e.get("reason"), 200)
            rejects[reason] = rejects.get(reason, 0) + 1
    if rejects:
        n = sum(rejects.values())
        top = sorted(rejects.items(), key=lambda kv: -kv[1])
        shown = "; ".join(r + (f" (x{c})" if c > 1 else "") for r, c in top[:5]) + ("; ..." if len(top) > 5 else "")
        out.append(f"the server refused {n} message(s): {shown}")
    return out


def _render_online(rep: Report, members: bool) -> str:
    ranks = f", {rep.ranks} server rank{'s' if rep.ranks != 1 else ''}" if rep.ranks is not None else ""
    runners = f"{rep.runners} runner{'s' if rep.runners != 1 else ''}" if rep.runners is not None else "? runners"
    lines = [f"experiment {rep.expdir}  (online: {runners}{ranks}, launcher {rep.launcher or '?'})", ""]
    if not rep.cycles:
        lines.append("no finished cycle yet")
        if rep.warnings:
            lines += ["", f"warnings ({len(rep.warnings)}):"] + [f"  {w}" for w in rep.warnings]
        return "\n".join(lines)
    hdr = (f"{'cycle':>5} {'total':>8} {'forecast':>8} {'transfer':>8} {'analysis':>8} {'run.idle':>8} "
           f"{'tasks':>5} {'recomputed':>10} {'recovered':>9}")
    lines += ["per cycle, seconds (run.idle: runners waiting for a member, summed over runners):", hdr]
    for c in rep.cycles:
        lines.append(f"{c.cycle:>5} {c.total:8.2f} {c.forecast:8.2f} {c.transfer:8.2f} {c.analysis:8.2f} "
                     f"{c.runner_idle:8.2f} {c.tasks:>5} {c.recomputed:>10} {c.recovered:>9}")
        if members:
            for m, r in sorted(c.members.items()):
                lines.append(f"        member {m:>3}: wait {r.get('wait_s', 0):7.2f}  forecast {r.get('run_s', 0):7.2f}  "
                             f"attempts {r.get('attempts', 0)}  runner {r.get('runner', '?')}")
    if rep.warnings:
        lines += ["", f"warnings ({len(rep.warnings)}):"] + [f"  {w}" for w in rep.warnings]
    s = rep.summary()
    lines += ["", f"mean +- std over {len(rep.cycles)} cycle(s):", f"{'':12} {'seconds':>20} {'% of total':>16}"]
    for name, label in (("total", "total"), ("forecast", "forecast"), ("transfer", "transfer"), ("analysis", "analysis"),
                        ("runner_idle", "runner idle")):
        f = s[name]
        pct = f"{f['pct_mean']:8.1f} +- {f['pct_std']:4.1f}" if f["pct_mean"] is not None else ""
        lines.append(f"{label:12} {f['mean']:11.2f} +- {f['std']:6.2f} {pct}".rstrip())
    return "\n".join(lines)


def render_report(rep: Report, *, members: bool = False) -> str:
    """Per-cycle figures and the mean +- std table, as text."""
    if rep.mode == "online":
        return _render_online(rep, members)
    lines = [f"experiment {rep.expdir}  (strategy {rep.strategy or '?'}, launcher {rep.launcher or '?'})", ""]
    if not rep.cycles:
        return "\n".join(lines + ["no finished cycle yet"] + [f"warning: {w}" for w in rep.warnings])
    hdr = (f"{'cycle':>5} {'total':>8} {'queuing':>8} {'running':>8} {'I/O':>7} {'overhead':>8} {'memberI/O':>9} "
           f"{'an.comp':>8} {'an.imbal':>8} {'jobs':>4} {'fail':>4} {'requeue':>7}")
    lines += ["per cycle, seconds (an.imbal: the analysis ranks' max / mean local-filter CPU seconds):", hdr]
    for c in rep.cycles:
        imbal = c.analysis.get("imbalance_cpu")
        imbal_s = f"{imbal:8.2f}" if isinstance(imbal, float) else f"{'-':>8}"
        lines.append(f"{c.cycle:>5} {c.total:8.2f} {c.queuing:8.2f} {c.running:8.2f} {c.io:7.2f} {c.overhead:8.2f} "
                     f"{c.member_io:9.2f} {c.analysis_compute:8.2f} {imbal_s} {c.jobs:>4} {c.failures:>4} {c.requeues:>7}")
        if members and isinstance(c.analysis.get("rank_cpu_s"), list):
            for r, cpu in enumerate(c.analysis["rank_cpu_s"]):
                work = c.analysis.get("rank_est_work", [])
                share = f", est. work {100 * work[r]:.1f}%" if r < len(work) else ""
                lines.append(f"        analysis rank {r:>3}: local filter {cpu:7.2f} s CPU{share}")
        if members:
            for m, r in sorted(c.members.items()):
                lines.append(f"        member {m:>3}: wait {r.get('wait_s', 0):7.2f}  run {r.get('run_s', 0):7.2f}  "
                             f"I/O {r.get('io_s', 0):6.3f}  attempts {r.get('attempts', 0)}"
                             )
    if rep.warnings:
        lines += ["", f"warnings ({len(rep.warnings)}):"] + [f"  {w}" for w in rep.warnings]
    s = rep.summary()
    lines += ["", f"mean +- std over {len(rep.cycles)} cycle(s) (Zheng et al. 2020, Table 2):",
              f"{'':10} {'seconds':>20} {'% of total':>16}"]
    for name, label in (("total", "total"), ("queuing", "queuing"), ("running", "running"), ("io", "I/O"), ("overhead", "overhead")):
        f = s[name]
        lines.append(f"{label:10} {f['mean']:11.2f} +- {f['std']:6.2f} {f['pct_mean']:8.1f} +- {f['pct_std']:4.1f}")
    return "\n".join(lines)


def report_json(rep: Report) -> dict[str, Any]:
    """The report as plain JSON-able data."""
    if rep.mode == "online":
        return {
            "expdir": str(rep.expdir), "mode": "online", "launcher": rep.launcher, "runners": rep.runners,
            "ranks": rep.ranks,
            "cycles": [{**{k: v for k, v in c.__dict__.items() if k != "members"},
                        "members": {str(m): r for m, r in c.members.items()}} for c in rep.cycles],
            "summary": rep.summary(),
            "warnings": rep.warnings,
        }
    return {
        "expdir": str(rep.expdir), "strategy": rep.strategy, "launcher": rep.launcher,
        "cycles": [{**{k: v for k, v in c.__dict__.items() if k != "members"},
                    "members": {str(m): r for m, r in c.members.items()}} for c in rep.cycles],
        "summary": rep.summary(),
        "warnings": rep.warnings,
    }
