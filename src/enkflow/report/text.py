"""The report as a text table (``enkflow report``) and as JSON (``enkflow report --json``)."""

from __future__ import annotations

from typing import Any

from enkflow.report.timing import Report


def _sec(x: float, width: int) -> str:
    """Seconds in ``width`` characters: two decimals, or two significant digits below 0.1 s (a 4 ms analysis
    shows as 0.004, not 0.00)."""
    return f"{x:{width}.2f}" if x == 0 or abs(x) >= 0.1 else f"{x:{width}.2g}"


def _failure_lines(rep: Report) -> list[str]:
    return rep.failure.lines() + [""] if rep.failure is not None else []


def _render_online(rep: Report, members: bool) -> str:
    ranks = f", {rep.ranks} server rank{'s' if rep.ranks != 1 else ''}" if rep.ranks is not None else ""
    runners = f"{rep.runners} runner{'s' if rep.runners != 1 else ''}" if rep.runners is not None else "? runners"
    lines = [f"experiment {rep.expdir}  (online: {runners}{ranks}, launcher {rep.launcher or '?'})", "",
             *_failure_lines(rep)]
    if not rep.cycles:
        lines.append("no finished cycle yet")
        if rep.warnings:
            lines += ["", f"warnings ({len(rep.warnings)}):"] + [f"  {w}" for w in rep.warnings]
        return "\n".join(lines)
    hdr = (f"{'cycle':>5} {'total':>8} {'forecast':>8} {'transfer':>8} {'analysis':>8} {'run.idle':>8} "
           f"{'tasks':>5} {'recomputed':>10} {'recovered':>9}")
    lines += ["per cycle, seconds (run.idle: runners waiting for a member, summed over runners):", hdr]
    for c in rep.cycles:
        lines.append(f"{c.cycle:>5} {_sec(c.total, 8)} {_sec(c.forecast, 8)} {_sec(c.transfer, 8)} "
                     f"{_sec(c.analysis, 8)} {_sec(c.runner_idle, 8)} {c.tasks:>5} {c.recomputed:>10} {c.recovered:>9}")
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
        lines.append(f"{label:12} {_sec(f['mean'], 11)} +- {_sec(f['std'], 6)} {pct}".rstrip())
    return "\n".join(lines)


def render_report(rep: Report, *, members: bool = False) -> str:
    """Per-cycle figures and the mean +- std table, as text."""
    if rep.mode == "online":
        return _render_online(rep, members)
    lines = [f"experiment {rep.expdir}  (strategy {rep.strategy or '?'}, launcher {rep.launcher or '?'})", "",
             *_failure_lines(rep)]
    if not rep.cycles:
        return "\n".join(lines + ["no finished cycle yet"] + [f"warning: {w}" for w in rep.warnings])
    idle = any(c.pilot_idle for c in rep.cycles)
    hdr = (f"{'cycle':>5} {'total':>8} {'queuing':>8} {'running':>8} {'I/O':>7} {'overhead':>8} {'memberI/O':>9} "
           f"{'an.comp':>8} {'an.imbal':>8} {'jobs':>4} {'fail':>4} {'requeue':>7}" + (f" {'p.idle':>8}" if idle else ""))
    lines += ["per cycle, seconds (an.imbal: the analysis ranks' max / mean local-filter CPU seconds"
              + ("; p.idle: pilot-seconds that pilots spanning cycles waited idle for the cycle" if idle else "") + "):", hdr]
    for c in rep.cycles:
        imbal = c.analysis.get("imbalance_cpu")
        imbal_s = f"{imbal:8.2f}" if isinstance(imbal, float) else f"{'-':>8}"
        lines.append(f"{c.cycle:>5} {_sec(c.total, 8)} {_sec(c.queuing, 8)} {_sec(c.running, 8)} {_sec(c.io, 7)} "
                     f"{_sec(c.overhead, 8)} {_sec(c.member_io, 9)} {_sec(c.analysis_compute, 8)} {imbal_s} {c.jobs:>4} "
                     f"{c.failures:>4} {c.requeues:>7}" + (f" {_sec(c.pilot_idle, 8)}" if idle else ""))
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
        lines.append(f"{label:10} {_sec(f['mean'], 11)} +- {_sec(f['std'], 6)} {f['pct_mean']:8.1f} +- {f['pct_std']:4.1f}")
    if idle:
        mean = sum(c.pilot_idle for c in rep.cycles) / len(rep.cycles)
        lines.append(f"pilots idle between cycles: {mean:.2f} pilot-seconds per cycle (CPUs held, not a share of the total)")
    return "\n".join(lines)


def report_json(rep: Report) -> dict[str, Any]:
    """The report as plain JSON-able data (with ``failure`` where the run failed)."""
    head: dict[str, Any] = ({"expdir": str(rep.expdir), "mode": "online", "launcher": rep.launcher, "runners": rep.runners,
                             "ranks": rep.ranks} if rep.mode == "online" else
                            {"expdir": str(rep.expdir), "strategy": rep.strategy, "launcher": rep.launcher})
    failed = {"failure": rep.failure.__dict__} if rep.failure is not None else {}  # a successful run's JSON as before
    return {
        **head,
        "cycles": [{**{k: v for k, v in c.__dict__.items() if k != "members"},
                    "members": {str(m): r for m, r in c.members.items()}} for c in rep.cycles],
        "summary": rep.summary(),
        "warnings": rep.warnings,
        **failed,
    }
