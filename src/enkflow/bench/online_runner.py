"""A runner of the online benchmarks: ``python -m enkflow.bench.online_runner ...``.

A :class:`~enkflow.online.runner.Runner` with a trivial model (``zero``: the
forecast is the state it got; ``l96``: Lorenz-96 RK4 steps) whose exchange is
timed through the runner's ``on_exchange`` hook. It writes its record to
``--out``: its tasks (cycle, member and, with ``--check``, the checksums of the
state it got and of the forecast it sent), the seconds of its PUTs, GETs,
waits for a task within a cycle and model, and its CPU seconds by cycle.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import numpy as np

from enkflow.bench.online_checks import checksum
from enkflow.models import lorenz96 as l96
from enkflow.online.fields import Field
from enkflow.online.runner import Exchange, Runner
from enkflow.transport import Transport


class ExchangeTimes:
    """A runner's ``on_exchange``: the seconds of its PUTs and GETs, and of its last READY."""

    def __init__(self) -> None:
        self.put_s = self.get_s = self.last_ready_s = 0.0

    def __call__(self, step: Exchange, seconds: float) -> None:
        if step is Exchange.PUT:
            self.put_s += seconds
        elif step is Exchange.GET:
            self.get_s += seconds
        else:
            self.last_ready_s = seconds


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run(a: argparse.Namespace) -> None:
    """Serve members until the server says stop; the record is written however the runner ends."""
    signal.signal(signal.SIGTERM, _terminated)  # stopped by the benchmark: its record is still written
    times = ExchangeTimes()
    r = Runner(a.address, Path(a.token_file).read_text().strip(), on_exchange=times, transport=Transport(a.transport))
    tasks: list[list[int]] = []  # cycle, member, checksum got, checksum sent
    ready_in_cycle = model_s = 0.0
    cpu0 = cpu_t = time.process_time()
    cpu_by_cycle: dict[int, float] = {}
    try:
        r.init([Field("x", "float64", (a.n,))])
        x = np.zeros(a.n)
        _, nsteps = r.expose(x)  # x is filled in place
        cpu0 = cpu_t = time.process_time()
        prev_cycle = None
        while nsteps:
            if prev_cycle == r.cycle:
                ready_in_cycle += times.last_ready_s
            prev_cycle = r.cycle
            got = checksum(x) if a.check else 0
            t = time.perf_counter()
            if a.model == "l96":
                y = x
                for _ in range(nsteps):
                    y = l96.step(y)
                x[...] = y
            model_s += time.perf_counter() - t
            if a.check:
                x += 1.0
            tasks.append([r.cycle, r.member, got, checksum(x) if a.check else 0])
            cycle = r.cycle
            _, nsteps = r.expose(x)
            # this task's model, its PUT and the GET of the next task count for this task's cycle
            now = time.process_time()
            cpu_by_cycle[cycle] = cpu_by_cycle.get(cycle, 0.0) + now - cpu_t
            cpu_t = now
    finally:
        r.close()
        Path(a.out).write_text(json.dumps({"tasks": tasks, "put_s": times.put_s, "get_s": times.get_s,
                                           "ready_in_cycle_s": ready_in_cycle, "model_s": model_s,
                                           "cpu_s": time.process_time() - cpu0,
                                           "cpu_by_cycle": {str(k): v for k, v in cpu_by_cycle.items()}}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enkflow.bench.online_runner",
                                description="a runner of enkflow bench online")
    p.add_argument("--address", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--model", choices=["zero", "l96"], default="zero")
    p.add_argument("--out", required=True)
    p.add_argument("--check", action="store_true")
    p.add_argument("--transport", choices=[t.value for t in Transport], default=Transport.AUTO.value)
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
