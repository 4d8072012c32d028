"""``enkflow bench online-scale``: many small members through the online server.

``members`` (1000) Lorenz-96 members (40 variables) on ``runners`` (16) runners
through a ``ranks``-rank server; ETKF of every variable observed each cycle
(one RK4 step, dt = 0.05, between observations). ``server_ms_per_member`` is the
forecast phases' wall time divided by the member exchanges (GET + forecast +
PUT of one member); ``--model zero`` (default) makes the forecast free, so this
is the server's (and the sockets') cost per member at ``runners``-fold
concurrency. Each runner times its PUTs, its waits for a task (READY to TASK,
within a cycle) and its GETs; their sums per member exchange are reported too. All over loopback
TCP, as before shared memory existed (issue 27): at 320 bytes a member the protocol costs, not the bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from enkflow.bench.online_checks import verify
from enkflow.bench.online_study import check_counts, online_study, say, scratch
from enkflow.errors import InputError
from enkflow.transport import Transport


def run_scale(args: argparse.Namespace) -> int:
    """``enkflow bench online-scale``: the table, then (``--json``) one JSON line; 1 if ``--check``
    found a problem."""
    check_counts(args)
    if args.members < 2:
        raise InputError("--members must be >= 2", item="members")
    with scratch(args, "enkflow-bench-online-scale-") as d:
        say(f"bench online-scale: {args.members} Lorenz-96 members, {args.runners} runners, {args.ranks} server rank(s), "
            f"{args.cycles} cycle(s) (+1 warm-up), model {args.model}")
        t0 = time.perf_counter()
        rec = online_study(d, problem="l96", n=40, ranks=args.ranks, runners=args.runners, members=args.members,
                           cycles=args.cycles + 1, transport=Transport.TCP, check=args.check, model=args.model, seed=args.seed,
                           timeout_s=args.timeout, say=say)
        res = _results(args, rec, time.perf_counter() - t0)
        if args.check:
            problems = verify(rec, args.members, args.cycles + 1)
            res["data_ok"] = not problems
            res["data_problems"] = problems[:10]
    print(_scale_table(res))
    if args.json:
        print(json.dumps(res))
    return 0 if res.get("data_ok", True) else 1


def _results(args: argparse.Namespace, rec: dict, wall: float) -> dict:
    """The figures from the study's record ``rec`` (the first cycle is the warm-up)."""
    diag = {int(k): v for k, v in rec["diagnostics"].items()}
    ks = sorted(diag)[1:]
    fs = sum(diag[k]["forecast_s"] for k in ks)
    exchanges = args.members * len(ks)
    timed = [t for r in rec["runners"] for t in r["tasks"] if t[0] in ks]
    runners = rec["runners"]
    cpu = rec["forecast_cpu_s"]
    ntasks = max(1, sum(len(r["tasks"]) for r in runners))
    return {
        "server_ms_per_member": 1e3 * fs / exchanges,
        "members_per_s": exchanges / fs,
        # CPU seconds of each server rank's process in the timed forecast phases, per member exchange
        "server_cpu_ms_per_member": [1e3 * sum(cpu[str(k)][r] for k in ks) / exchanges for r in range(args.ranks)],
        "runner_cpu_ms_per_member": 1e3 * sum(r["cpu_s"] for r in runners) / ntasks,
        "forecast_s": [diag[k]["forecast_s"] for k in ks],
        "warmup_forecast_s": diag[min(diag)]["forecast_s"],
        "analysis_s": [diag[k]["analysis_s"] for k in ks],
        "rmse_prior": [diag[k].get("rmse_prior") for k in sorted(diag)],
        "rmse_analysis": [diag[k].get("rmse_analysis") for k in sorted(diag)],
        # the runners' sums over every cycle (warm-up included), per member exchange
        "runner_put_ms_per_member": 1e3 * sum(r["put_s"] for r in runners) / ntasks,
        "runner_get_ms_per_member": 1e3 * sum(r["get_s"] for r in runners) / ntasks,
        "runner_wait_ms_per_member": 1e3 * sum(r["ready_in_cycle_s"] for r in runners) / ntasks,
        "runner_model_ms_per_member": 1e3 * sum(r["model_s"] for r in runners) / ntasks,
        "tasks_per_runner": [len(r["tasks"]) for r in runners],
        "timed_tasks": len(timed),
        "runners_terminated": rec["runners_terminated"],
        "wall_s": wall,
        "members": args.members, "runners": args.runners, "ranks": args.ranks, "cycles": args.cycles,
        "model": args.model, "method": "etkf", "cpus": os.cpu_count(),
    }


def _scale_table(r: dict) -> str:
    lines = [
        f"online at scale: {r['members']} Lorenz-96 members, {r['runners']} runners, {r['ranks']} server rank(s), "
        f"ETKF, {r['cycles']} timed cycle(s), model {r['model']}",
        f"  forecast phase per cycle: {', '.join(f'{t:.2f}' for t in r['forecast_s'])} s "
        f"(warm-up {r['warmup_forecast_s']:.2f} s); analysis {', '.join(f'{t:.2f}' for t in r['analysis_s'])} s",
        f"  server: {r['server_ms_per_member']:.3f} ms of forecast phase per member exchange ({r['members_per_s']:.0f} members/s); "
        f"CPU per member exchange, rank by rank: {', '.join(f'{c:.3f}' for c in r['server_cpu_ms_per_member'])} ms",
        f"  runners, per member: PUT {r['runner_put_ms_per_member']:.3f} ms, waiting for a task "
        f"{r['runner_wait_ms_per_member']:.3f} ms, GET {r['runner_get_ms_per_member']:.3f} ms, "
        f"model {r['runner_model_ms_per_member']:.3f} ms; CPU {r['runner_cpu_ms_per_member']:.3f} ms",
        f"  RMSE prior -> analysis, last cycle: {r['rmse_prior'][-1]:.3f} -> {r['rmse_analysis'][-1]:.3f}",
    ]
    if "data_ok" in r:
        lines.append(f"  exchanged data checked: {'all right' if r['data_ok'] else 'WRONG: ' + '; '.join(r['data_problems'])}")
    return "\n".join(lines)
