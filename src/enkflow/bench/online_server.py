"""One rank of the online benchmarks' server: ``[mpiexec -n P] python -m enkflow.bench.online_server ...``.

It serves the exchange or the Lorenz-96 problem (:mod:`enkflow.bench.online_problems`)
to the benchmark's runners, timing the CPU seconds of every forecast phase on
every rank through the server's observer, and writes its record to
``DIR/server.json``: the wall seconds, each cycle's diagnostics, the CPU
seconds and, with ``--check``, the checksums of the exchanged states.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from enkflow.bench.online_problems import exchange_problem, l96_problem
from enkflow.jobs.events import EventLog
from enkflow.online.scheduler import SchedulerConfig
from enkflow.transport import Transport
from enkflow.online.server import Server, ServerConfig
from enkflow.parallel import get_comm


class ForecastCPU:
    """A :class:`~enkflow.online.server.ForecastObserver`: this process's CPU seconds in each
    cycle's forecast phase (its ZeroMQ I/O thread's included)."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self._t0 = 0.0

    def forecast_started(self, cycle: int) -> None:
        self._t0 = time.process_time()

    def forecast_ended(self, cycle: int) -> None:
        self.seconds[cycle] = time.process_time() - self._t0


def serve(a: argparse.Namespace) -> None:
    """Run the study of ``a`` (the options of :func:`main`) on this rank."""
    comm = get_comm()
    d = Path(a.dir)
    token = (d / "token").read_text().strip()
    bench = (exchange_problem(a.n, a.members, a.nsteps, a.seed, a.check, comm) if a.problem == "exchange"
             else l96_problem(a.members, a.nsteps, a.seed, a.check, comm))
    cfg = ServerConfig(token=token, heartbeat_s=1.0, heartbeat_timeout_s=120.0, address_file=d / "address",
                       scheduler=SchedulerConfig(due_floor=600.0), min_runners=a.runners,
                       transport=Transport(a.transport))
    t0 = time.perf_counter()
    cpu = ForecastCPU()
    server = Server(bench.problem, cfg, comm=comm, events=EventLog(d / "events.jsonl"), observer=cpu)
    diag = server.run(list(range(1, a.cycles + 1)))
    wall = time.perf_counter() - t0
    cpus = comm.allgather_obj(cpu.seconds)
    if comm.rank == 0:
        out = {"ranks": comm.size, "wall_s": wall, "diagnostics": {str(k): v for k, v in diag.items()},
               "forecast_cpu_s": {str(k): [c[k] for c in cpus] for k in cpu.seconds},
               "initial": bench.initial, "forecasts": {str(k): v for k, v in bench.obs.forecasts.items()},
               "analyses": {str(k): v for k, v in bench.sink.analyses.items()}}
        (d / "server.json").write_text(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enkflow.bench.online_server",
                                description="one rank of the server of enkflow bench online")
    p.add_argument("--dir", required=True)
    p.add_argument("--problem", choices=["exchange", "l96"], required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--members", type=int, required=True)
    p.add_argument("--cycles", type=int, required=True)
    p.add_argument("--nsteps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runners", type=int, default=1, help="hand out no member before this many runners joined")
    p.add_argument("--check", action="store_true")
    p.add_argument("--transport", choices=[t.value for t in Transport], default=Transport.AUTO.value,
                   help="shm: shared-memory segments for runners on this node (an error where it cannot make them); "
                        "tcp: none; auto (default): where it can")
    serve(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
