"""``enkflow bench online``: the online mode's state exchange against raw pyzmq (TCP) and against a
memory copy (shared memory), and seconds per cycle online against offline. One run, four measurements:

1. *Raw pyzmq baseline* (``raw_zmq_gbps``): :mod:`enkflow.bench.online_raw`, with
   ``cycles`` timed rounds. The baseline runs twice, before and after the online
   exchange, and the faster run counts (on a shared machine a disturbed run
   would flatter the ratio).

2. *Online exchange over TCP* (``exchange_gbps``). The real server (``mpiexec -n ranks
   python -m enkflow.bench.online_server``) holding ``members`` states of
   ``state_mb`` MB (one assimilated float64 field, 1 MB = 1e6 bytes), and
   ``runners`` processes using :class:`~enkflow.online.runner.Runner` with a
   model that does nothing (it sends back what it got). Timed: the server's
   forecast phase of each cycle (``forecast_s`` of the cycle's diagnostics, rank
   0: from the start of the cycle's forecast phase until every member's forecast
   has arrived on every rank and was accepted), which contains every GET (server
   -> runner) and PUT (runner -> server) of the cycle, the scheduling
   (READY/TASK), the checks of each forecast and its copy into the ensemble. Not
   timed: the analysis (an ETKF with 64 observations) between forecast phases.
   The server hands out no member before every runner has joined
   (``ServerConfig.min_runners``); one untimed warm-up cycle (it also contains
   the runners' start-up and the first touch of every buffer), then ``cycles``
   timed cycles. Bytes: ``2 x members x cycles x state bytes`` (every member's
   state once each way).

   The server makes no shared memory and the runners use loopback TCP
   (``transport = "tcp"``), as before issue 27. Both rates are bytes moved / timed
   seconds (1 GB = 1e9 bytes); ``ratio`` is exchange / raw; ``ratio_best`` the rate of
   the fastest exchange cycle over that of the fastest raw round (of both raw runs).

2b. *Online exchange over shared memory* (``shm_exchange_gbps``): the same study, timed
   the same way, with server and runners on ``transport = "shm"`` (the runners are on
   the server's node): a GET is one copy from the server rank's store segment into the
   runner's array, a PUT one copy into the task's slot segment, the server checks the
   slot and copies it into the ensemble off the runners' path. Against the physical
   limit, ``memcpy_gbps``: ``np.copyto`` of one whole state between two touched arrays
   in this process, best of 7, measured right after (:mod:`enkflow.bench.memcpy`).
   ``shm_ratio`` = shm_exchange_gbps / memcpy_gbps (a member's exchange moves its
   state twice, in and out, and the bytes moved count both, so 1.0 would mean each
   direction costs one copy's time with the cycle's members one after another);
   ``shm_ratio_best`` the fastest cycle's; ``shm_over_tcp`` = shm_exchange_gbps /
   exchange_gbps. Where this node has no shared memory for segments, the shm keys are
   null and ``shm_unavailable`` says why.

3. *Seconds per cycle, online vs offline*: the ``enkflow demo`` problem
   (:func:`enkflow.experiment.demo_problem.prepare`, the tiny synthetic land problem,
   LETKF) with ``members`` and ``cycles``, run once offline (restart files, job
   scheme, ``runners`` pilot workers) and once online (``runners`` runners, one
   server rank, the default ``[online] transport``: shared memory on one node), each
   from its own fresh copy: ``seconds_per_cycle_*`` is the mean
   of ``cycle_end - cycle_start`` of its event log, ``wall_s_*`` the whole run
   (start-up included). The two analyses must agree (``online_equals_offline``).

``--check`` makes the model add 1 to every element and has the runners and the
server checksum every state they exchange (:mod:`enkflow.bench.online_checks`), in
both exchange studies.
It costs passes over the data, so it is off for the timing runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.bench.memcpy import CopyLimit, memcpy_limit
from enkflow.bench.online_checks import verify
from enkflow.bench.online_raw import raw_zmq
from enkflow.bench.online_study import check_counts, child_env, online_study, say, scratch
from enkflow.errors import EnkflowError, InputError
from enkflow.experiment.config import load_experiment
from enkflow.experiment.demo_problem import DemoSettings, prepare
from enkflow.experiment.driver import Experiment
from enkflow.jobs.events import iter_events
from enkflow.online.launch import OnlineExperiment
from enkflow.online.segments import available
from enkflow.transport import Transport


def run_online(args: argparse.Namespace) -> int:
    """``enkflow bench online``: the table, then (``--json``) one JSON line; 1 if ``--check`` found a problem."""
    check_counts(args)
    if args.state_mb <= 0:
        raise InputError("--state-mb must be > 0", item="state_mb")
    n = max(1, int(round(args.state_mb * 1e6 / 8)))
    state_bytes = 8 * n
    with scratch(args, "enkflow-bench-online-") as d:
        say(f"bench online: {args.members} members of {state_bytes / 1e6:g} MB, {args.ranks} server rank(s), "
            f"{args.runners} runners, {args.cycles} cycle(s) (+1 warm-up)")
        env = child_env()
        say("raw pyzmq baseline ...")
        raw = [raw_zmq(n, args.ranks, args.runners, args.members, args.cycles, env, args.timeout)]
        say("online exchange over TCP ...")
        rec = _exchange_study(args, d / "exchange", n, Transport.TCP)
        shm_unavailable = available()
        shm_rec = None
        if shm_unavailable is None:
            say("online exchange over shared memory ...")
            shm_rec = _exchange_study(args, d / "exchange-shm", n, Transport.SHM)
        else:
            say(f"no exchange over shared memory: {shm_unavailable}")
        limit = memcpy_limit(n)
        say("raw pyzmq baseline again ...")
        raw.append(raw_zmq(n, args.ranks, args.runners, args.members, args.cycles, env, args.timeout))
        res = _exchange_results(args, rec, raw, state_bytes)
        res.update(_shm_results(args, shm_rec, limit, res["exchange_gbps"]), shm_unavailable=shm_unavailable)
        if args.check:
            problems = verify(rec, args.members, args.cycles + 1)
            problems += [f"shared memory: {p}" for p in (verify(shm_rec, args.members, args.cycles + 1) if shm_rec else [])]
            res["data_ok"] = not problems
            res["data_problems"] = problems[:10]
        if not args.no_compare:
            say("demo problem, offline and online ...")
            res.update(_demo_compare(d / "demo", args.members, args.cycles, args.runners, args.seed))
        else:
            res.update(seconds_per_cycle_online=None, seconds_per_cycle_offline=None)
        res.update(state_mb=state_bytes / 1e6, ranks=args.ranks, runners=args.runners, members=args.members,
                   cycles=args.cycles, check=bool(args.check), cpus=os.cpu_count())
    print(_online_table(res))
    if args.json:
        print(json.dumps(res))
    return 0 if res.get("data_ok", True) else 1


def _exchange_study(args: argparse.Namespace, d: Path, n: int, transport: Transport) -> dict:
    """The exchange problem served by ``args.ranks`` ranks to ``args.runners`` runners over ``transport``."""
    return online_study(d, problem="exchange", n=n, ranks=args.ranks, runners=args.runners, members=args.members,
                        cycles=args.cycles + 1, transport=transport, check=args.check, timeout_s=args.timeout, say=say)


def _timed_cycles(rec: dict) -> tuple[list[int], list[float]]:
    """The timed cycles of a study's record (the first is the warm-up) and their forecast phases' seconds."""
    diag = {int(k): v for k, v in rec["diagnostics"].items()}
    ks = sorted(diag)[1:]
    return ks, [diag[k]["forecast_s"] for k in ks]


def _cpu_per_cycle(rec: dict, ks: list[int]) -> list[float]:
    """CPU seconds of every process (server ranks and runners) in each of the cycles ``ks``: where the
    cores are busy anyway, the ratio of two rates follows the ratio of these."""
    return [sum(rec["forecast_cpu_s"][str(k)]) + sum(r["cpu_by_cycle"].get(str(k), 0.0) for r in rec["runners"])
            for k in ks]


def _shm_results(args: argparse.Namespace, rec: dict | None, limit: CopyLimit, tcp_gbps: float) -> dict:
    """The shared-memory exchange's rate against one memory copy's (``limit``) and the TCP exchange's
    (``tcp_gbps``); the rates are null without a record ``rec``."""
    res: dict = {"memcpy_gbps": limit.gbps, "memcpy_s": limit.seconds}
    if rec is None:
        return res | dict.fromkeys(("shm_exchange_gbps", "shm_ratio", "shm_ratio_best", "shm_over_tcp",
                                    "shm_exchange_forecast_s", "shm_exchange_cpu_s", "shm_server_forecast_cpu_s"))
    ks, timed = _timed_cycles(rec)
    per_cycle = 2 * args.members * limit.nbytes
    gbps = per_cycle * len(ks) / sum(timed) / 1e9
    return res | {"shm_exchange_gbps": gbps, "shm_ratio": gbps / limit.gbps,
                  "shm_ratio_best": per_cycle / min(timed) / 1e9 / limit.gbps, "shm_over_tcp": gbps / tcp_gbps,
                  "shm_exchange_forecast_s": timed, "shm_exchange_cpu_s": _cpu_per_cycle(rec, ks),
                  "shm_server_forecast_cpu_s": [rec["forecast_cpu_s"][str(k)] for k in ks]}


def _exchange_results(args: argparse.Namespace, rec: dict, raw: list[tuple[list[float], list[float]]],
                      state_bytes: int) -> dict:
    """The rates and their parts from the server's record ``rec`` and the raw runs' (seconds, CPU
    seconds) of each round."""
    moved = 2 * args.members * args.cycles * state_bytes
    raw_runs = [t for t, _ in raw]
    best = min(range(2), key=lambda i: sum(raw_runs[i]))  # the faster run: the baseline is not the one slowed down
    raw_times = raw_runs[best]
    diag = {int(k): v for k, v in rec["diagnostics"].items()}
    ks, timed = _timed_cycles(rec)
    res: dict = {
        "exchange_gbps": moved / sum(timed) / 1e9,
        "raw_zmq_gbps": moved / sum(raw_times) / 1e9,
    }
    res["ratio"] = res["exchange_gbps"] / res["raw_zmq_gbps"]
    # Best single cycle vs best single round: less sensitive to a disturbance of one of them.
    per = 2 * args.members * state_bytes
    res["ratio_best"] = (per / min(timed)) / (per / min(t for run in raw_runs for t in run))
    res.update(exchange_forecast_s=timed, warmup_forecast_s=diag[min(diag)]["forecast_s"], raw_round_s=raw_times,
               raw_zmq_gbps_runs=[moved / sum(t) / 1e9 for t in raw_runs],
               analysis_s=[diag[k]["analysis_s"] for k in sorted(diag)], bytes_moved=moved,
               tasks=sum(diag[k]["tasks"] for k in ks),
               server_transfer_s=[diag[k]["transfer_s"] for k in ks],
               server_forecast_cpu_s=[rec["forecast_cpu_s"][str(k)] for k in ks],
               exchange_cpu_s=_cpu_per_cycle(rec, ks), raw_cpu_s=raw[best][1], runners_terminated=rec["runners_terminated"])
    return res


def _demo_compare(d: Path, members: int, cycles: int, runners: int, seed: int) -> dict:
    """The demo problem offline and online: seconds per cycle (event log) and wall seconds of each."""
    out: dict = {}
    means: dict[str, list[np.ndarray]] = {}
    for mode in ("offline", "online"):
        sub = d / mode
        sub.mkdir(parents=True)
        s = DemoSettings(members=members, cycles=cycles, seed=seed, mode=mode, runners=runners, workers=runners)
        cfg = load_experiment(prepare(sub, s, lambda m: None))
        t0 = time.perf_counter()
        (OnlineExperiment(cfg) if mode == "online" else Experiment(cfg)).run()
        wall = time.perf_counter() - t0
        starts: dict[int, float] = {}
        ends: dict[int, float] = {}
        for e in iter_events(cfg.dir.events):
            if e.get("event") in ("cycle_start", "cycle_end") and isinstance(e.get("cycle"), int):
                (starts if e["event"] == "cycle_start" else ends).setdefault(e["cycle"], e["t"])
        per = [ends[k] - starts[k] for k in cfg.cycle_numbers if k in starts and k in ends]
        if len(per) != len(cfg.cycle_numbers):
            raise EnkflowError(f"the {mode} demo run has no cycle_start/cycle_end for every cycle")
        out[f"seconds_per_cycle_{mode}"] = sum(per) / len(per)
        out[f"wall_s_{mode}"] = wall
        say(f"  demo {mode}: {out[f'seconds_per_cycle_{mode}']:.2f} s per cycle, {wall:.1f} s in all")
        means[mode] = []
        for k in cfg.cycle_numbers:
            with netCDF4.Dataset(cfg.dir.cycle(k).mean) as ds:
                means[mode].append(np.asarray(ds["soil_moisture"][:]))
    out["online_equals_offline"] = all(np.array_equal(a, b) for a, b in zip(means["offline"], means["online"]))
    return out


def _online_table(r: dict) -> str:
    gb = r["bytes_moved"] / 1e9
    lines = [
        f"online state exchange: {r['members']} members x {r['state_mb']:g} MB, {r['ranks']} server rank(s), "
        f"{r['runners']} runners, {r['cycles']} timed cycle(s); {gb:.2f} GB moved (both directions)",
        f"  {'':28s}{'seconds':>10s}{'GB/s':>10s}",
        f"  {'raw pyzmq (same streams)':28s}{sum(r['raw_round_s']):10.3f}{r['raw_zmq_gbps']:10.3f}",
        f"  {'enkflow exchange over TCP':28s}{sum(r['exchange_forecast_s']):10.3f}{r['exchange_gbps']:10.3f}",
        f"  ratio exchange / raw: {r['ratio']:.2f} (target >= 0.8); best cycle / best round: {r['ratio_best']:.2f}",
        f"  CPU seconds per cycle, every process: raw {sum(r['raw_cpu_s']) / len(r['raw_cpu_s']):.2f}, "
        f"exchange {sum(r['exchange_cpu_s']) / len(r['exchange_cpu_s']):.2f} (server ranks "
        f"{sum(map(sum, r['server_forecast_cpu_s'])) / len(r['server_forecast_cpu_s']):.2f}) on {r['cpus']} CPUs",
    ]
    if r["shm_exchange_gbps"] is None:
        lines.append(f"  no exchange over shared memory: {r['shm_unavailable']}")
    else:
        lines += [
            f"  {'memory copy (np.copyto)':28s}{r['memcpy_s']:10.4f}{r['memcpy_gbps']:10.3f}   (one state, best of 7)",
            f"  {'exchange, shared memory':28s}{sum(r['shm_exchange_forecast_s']):10.3f}{r['shm_exchange_gbps']:10.3f}",
            f"  ratio shared memory / memory copy: {r['shm_ratio']:.2f} (target >= 0.5); best cycle: "
            f"{r['shm_ratio_best']:.2f}; shared memory / TCP: {r['shm_over_tcp']:.2f}; CPU seconds per cycle "
            f"{sum(r['shm_exchange_cpu_s']) / len(r['shm_exchange_cpu_s']):.2f}",
        ]
    if "data_ok" in r:
        lines.append(f"  exchanged data checked: {'all right' if r['data_ok'] else 'WRONG: ' + '; '.join(r['data_problems'])}")
    if r.get("seconds_per_cycle_online") is not None:
        lines += [
            f"demo problem, {r['members']} members, {r['cycles']} cycle(s), seconds per cycle (wall of the whole run):",
            f"  offline {r['seconds_per_cycle_offline']:.2f} ({r['wall_s_offline']:.1f})   "
            f"online {r['seconds_per_cycle_online']:.2f} ({r['wall_s_online']:.1f})   "
            f"analyses equal: {r['online_equals_offline']}",
        ]
    return "\n".join(lines)
