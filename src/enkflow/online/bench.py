"""``enkflow bench online`` and ``enkflow bench online-scale``: the online mode's state exchange.

**online** (one run, three measurements):

1. *Raw pyzmq baseline* (``raw_zmq_gbps``). ``ranks`` receiver processes, each a
   ROUTER socket on loopback TCP holding its share of one member's state (the
   same row blocks the server ranks own), and ``runners`` sender processes, each
   one DEALER socket connected to every receiver. A round is ``members`` tasks
   dealt round-robin to the senders; a task is what a runner does with a member,
   without the protocol: send this member's share to every receiver (one frame
   each, ``copy=False``) and wait for their small replies, then ask every receiver
   for its share and receive it (``copy=False`` on both sides; nothing is copied
   into a state array). Timed per round on the coordinating process: from the
   moment it tells every (connected, warmed-up) sender "go" to the last sender's
   "done". One untimed warm-up round, then ``cycles`` timed rounds. The baseline
   runs twice, before and after the online exchange, and the faster run counts
   (on a shared machine a disturbed run would flatter the ratio).

2. *Online exchange* (``exchange_gbps``). The real server (:class:`Server`,
   ``mpiexec -n ranks python -m enkflow.online.bench server ...``) holding
   ``members`` states of ``state_mb`` MB (one assimilated float64 field, 1 MB =
   1e6 bytes), and ``runners`` processes using :class:`Runner` with a model that
   does nothing (it sends back what it got). Timed: the server's forecast phase of
   each cycle (``forecast_s`` of the cycle's diagnostics, rank 0: from the start
   of the cycle's forecast phase until every member's forecast has arrived on
   every rank and was accepted), which contains every GET (server -> runner) and
   PUT (runner -> server) of the cycle, the scheduling (READY/TASK), the checks of
   each forecast and its copy into the ensemble. Not timed: the analysis (an ETKF
   with 64 observations) between forecast phases. The server hands out no member
   before every runner has joined (``ServerConfig.min_runners``); one untimed
   warm-up cycle (it also contains the runners' start-up and the first touch of
   every buffer), then ``cycles`` timed cycles. Bytes:
   ``2 x members x cycles x state bytes`` (every member's state once each way).

   Both rates are bytes moved / timed seconds (1 GB = 1e9 bytes); ``ratio`` is
   exchange / raw; ``ratio_best`` the rate of the fastest exchange cycle over that
   of the fastest raw round (of both raw runs).

3. *Seconds per cycle, online vs offline*: the ``enkflow demo`` problem
   (:func:`enkflow.experiment.demo.prepare`, the tiny synthetic land problem,
   LETKF) with ``members`` and ``cycles``, run once offline (restart files, job
   scheme, ``runners`` pilot workers) and once online (``runners`` runners, one
   server rank), each from its own fresh copy: ``seconds_per_cycle_*`` is the mean
   of ``cycle_end - cycle_start`` of its event log, ``wall_s_*`` the whole run
   (start-up included). The two analyses must agree (``online_equals_offline``).

``--check`` makes the model add 1 to every element and has the runners and the
server checksum every state they exchange (an exact, position-sensitive uint64
sum): every state a runner got must equal the member's previous analysis (or
initial state), every forecast the analysis saw must equal what a runner sent.
It costs passes over the data, so it is off for the timing runs.

**online-scale**: ``members`` (1000) Lorenz-96 members (40 variables) on
``runners`` (16) runners through a ``ranks``-rank server; ETKF of every variable
observed each cycle (one RK4 step, dt = 0.05, between observations).
``server_ms_per_member`` is the forecast phases' wall time divided by the member
exchanges (GET + forecast + PUT of one member); ``--model zero`` (default) makes
the forecast free, so this is the server's (and the sockets') cost per member at
``runners``-fold concurrency. Each runner times its PUTs, its waits for a task
(READY to TASK, within a cycle) and its GETs; their sums per member exchange are
reported too.

``python -m enkflow.online.bench {server,runner,raw-recv,raw-send}`` are the
processes the benchmarks start.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from enkflow.errors import EnkflowError, InputError
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.experiment.cycling import ObservationSpace, OutputSink
from enkflow.jobs.files import log_tail

_MASK = (1 << 64) - 1
N_OBS_EXCHANGE = 64


# -- checksums ------------------------------------------------------------------------------


def checksum(x: np.ndarray, start: int = 0) -> int:
    """Exact, order-independent and position-sensitive: sum of (bits of x[i]) * (start + i + 1) mod 2**64.

    The checksums of the pieces of a vector (each with its start) add up, mod 2**64, to the whole's.
    """
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    idx = np.arange(start + 1, start + 1 + x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(np.multiply(x.view(np.uint64), idx).sum(dtype=np.uint64))


def _member_sums(X: np.ndarray, row_start: int, comm) -> list[int]:
    """Every member's checksum of the rows ``X`` of every rank (collective)."""
    mine = [checksum(X[:, j], row_start) for j in range(X.shape[1])]
    every = comm.allgather_obj(mine)
    return [sum(r[j] for r in every) & _MASK for j in range(X.shape[1])]


# -- the server's problems ----------------------------------------------------------------------


class SparseObs(ObservationSpace):
    """The exchange benchmark's observation space: ``n_obs`` state elements, evenly spaced; with
    ``sums``, the forecast checksums of every member (rank 0 keeps them in ``forecasts``)."""

    def __init__(self, n: int, n_members: int, seed: int, sums: bool):
        self.n_obs = min(N_OBS_EXCHANGE, n)
        self.idx = np.linspace(0, n - 1, self.n_obs).astype(np.int64)
        self.n_members, self.seed, self.sums = n_members, seed, sums
        self.forecasts: dict[int, list[int]] = {}

    def observations(self, cycle: int):
        from enkflow.obs import ObsSet

        rng = np.random.default_rng([self.seed, 7, cycle])
        y = (self.n_members + 1) / 2 + rng.standard_normal(self.n_obs)
        return ObsSet(y, np.ones(self.n_obs), self.idx.astype(float))

    def _select(self, X: np.ndarray, row_start: int, comm) -> np.ndarray:
        out = np.zeros((self.n_obs,) + X.shape[1:])
        sel = (self.idx >= row_start) & (self.idx < row_start + X.shape[0])
        out[sel] = X[self.idx[sel] - row_start]
        return comm.allreduce_sum(out)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm) -> np.ndarray:
        if self.sums:
            self.forecasts[cycle] = _member_sums(X, row_start, comm)
        return self._select(X, row_start, comm)

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm) -> np.ndarray:
        return self._select(Xa, row_start, comm)


class SumSink(OutputSink):
    """An output sink keeping each cycle's analysis checksums (or nothing)."""

    def __init__(self, comm, sums: bool):
        self.comm, self.sums = comm, sums
        self.analyses: dict[int, list[int]] = {}

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None:
        if self.sums:
            self.analyses[cycle] = _member_sums(Xa, row_start, self.comm)


class L96Obs(ObservationSpace):
    """Lorenz-96 twin: the truth advanced ``nsteps`` RK4 steps per cycle, every variable observed
    (H = I, R = I); the same on every rank (seeded by cycle)."""

    def __init__(self, seed: int, nsteps: int, sums: bool = False):
        from enkflow.models import lorenz96 as l96

        self.l96, self.seed, self.nsteps, self.sums = l96, seed, nsteps, sums
        self.forecasts: dict[int, list[int]] = {}
        self.truth0 = l96.spin_up(np.random.default_rng([seed, 0]))
        self._truth = {0: self.truth0}

    def truth(self, cycle: int) -> np.ndarray:
        if cycle not in self._truth:
            x = self.truth(cycle - 1)
            for _ in range(self.nsteps):
                x = self.l96.step(x)
            self._truth[cycle] = x
        return self._truth[cycle]

    def observations(self, cycle: int):
        from enkflow.obs import ObsSet

        t = self.truth(cycle)
        y = t + np.random.default_rng([self.seed, 2, cycle]).standard_normal(t.size)
        return ObsSet(y, np.ones(t.size), np.arange(t.size, dtype=float))

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm) -> np.ndarray:
        if self.sums:
            self.forecasts[cycle] = _member_sums(X, row_start, comm)
        return comm.allgather_rows(np.ascontiguousarray(X))

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm) -> np.ndarray:
        return comm.allgather_rows(np.ascontiguousarray(Xa))


def _serve(a: argparse.Namespace) -> int:
    """``python -m enkflow.online.bench server``: one rank of the benchmark's server."""
    from enkflow.analysis import ETKF
    from enkflow.experiment.step import AnalysisStep
    from enkflow.jobs.events import EventLog
    from enkflow.online.fields import Field
    from enkflow.online.scheduler import SchedulerConfig
    from enkflow.online.server import Problem, Server, ServerConfig
    from enkflow.online.store import MemoryStore
    from enkflow.parallel import get_comm

    comm = get_comm()
    d = Path(a.dir)
    token = (d / "token").read_text().strip()
    sink = SumSink(comm, a.check)
    initial_sums: list[int] = []
    if a.problem == "exchange":
        obs = SparseObs(a.n, a.members, a.seed, a.check)
        truth = lambda cycle: None  # noqa: E731

        def initial(store: MemoryStore) -> None:
            lo, hi = store.ranges[0]
            ramp = 1e-7 * np.arange(lo, hi, dtype=np.float64)
            for m in range(1, store.n_members + 1):
                np.add(ramp, float(m), out=store.column(0, m))
            if a.check:
                initial_sums.extend(_member_sums(store.parts[0], store.row_start, comm))
        fields = (Field("x", "float64", (a.n,)),)
    else:
        obs = L96Obs(a.seed, a.nsteps, a.check)
        truth = obs.truth

        def initial(store: MemoryStore) -> None:
            X = obs.truth0[:, None] + np.random.default_rng([a.seed, 1]).standard_normal((obs.truth0.size, a.members))
            store.parts[0][...] = X[store.row_start:store.row_stop]
            if a.check:
                initial_sums.extend(_member_sums(store.parts[0], store.row_start, comm))
        fields = (Field("x", "float64", (40,)),)
    problem = Problem(fields, a.members, initial, lambda cycle: a.nsteps, obs, AnalysisStep(ETKF(), output=sink, truth=truth))
    cfg = ServerConfig(token=token, heartbeat_s=1.0, heartbeat_timeout_s=120.0, address_file=d / "address",
                       scheduler=SchedulerConfig(due_floor=600.0), min_runners=a.runners)
    t0 = time.perf_counter()
    server = Server(problem, cfg, comm=comm, events=EventLog(d / "events.jsonl"))
    cpu: dict[int, float] = {}
    forecast = getattr(server, "_forecast", None)  # the forecast phase (the bench times its CPU seconds)

    def timed_forecast(k: int, done: set[int]) -> None:
        """The forecast phase, with this process's CPU seconds (its ZeroMQ I/O thread's included)."""
        t = time.process_time()
        forecast(k, done)
        cpu[k] = time.process_time() - t

    if callable(forecast):
        server._forecast = timed_forecast  # type: ignore[method-assign]
    diag = server.run(list(range(1, a.cycles + 1)))
    wall = time.perf_counter() - t0
    cpus = comm.allgather_obj(cpu)
    if comm.rank == 0:
        out = {"ranks": comm.size, "wall_s": wall, "diagnostics": {str(k): v for k, v in diag.items()},
               "forecast_cpu_s": {str(k): [c[k] for c in cpus] for k in cpu},
               "initial": initial_sums, "forecasts": {str(k): v for k, v in obs.forecasts.items()},
               "analyses": {str(k): v for k, v in sink.analyses.items()}}
        (d / "server.json").write_text(json.dumps(out))
    return 0


# -- the runners --------------------------------------------------------------------------------


def _runner(a: argparse.Namespace) -> int:
    """``python -m enkflow.online.bench runner``: a runner with a timed exchange and a trivial model."""
    from enkflow.online.fields import Field
    from enkflow.online.runner import Runner

    class Timed(Runner):
        """Times the three parts of :meth:`Runner.expose` (a benchmark's view of its internals)."""

        put_s = ready_s = get_s = 0.0

        def _put(self, arrays):  # type: ignore[override]
            t = time.perf_counter()
            super()._put(arrays)
            self.put_s += time.perf_counter() - t

        def _next_task(self):  # type: ignore[override]
            t = time.perf_counter()
            hdr = super()._next_task()
            self.last_ready_s = time.perf_counter() - t
            return hdr

        def _get(self, arrays):  # type: ignore[override]
            t = time.perf_counter()
            super()._get(arrays)
            self.get_s += time.perf_counter() - t

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)  # stopped by the benchmark: its record is still written
    token = Path(a.token_file).read_text().strip()
    r = Timed(a.address, token)
    tasks: list[list] = []  # cycle, member, checksum got, checksum sent
    ready_in_cycle = model_s = 0.0
    cpu0 = cpu_t = time.process_time()
    cpu_by_cycle: dict[int, float] = {}
    try:
        r.init([Field("x", "float64", (a.n,))])
        x = np.zeros(a.n)
        x, nsteps = r.expose(x)
        cpu0 = cpu_t = time.process_time()
        prev_cycle = None
        if a.model == "l96":
            from enkflow.models import lorenz96 as l96
        while nsteps:
            if prev_cycle == r.cycle:
                ready_in_cycle += r.last_ready_s
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
            x, nsteps = r.expose(x)
            # this task's model, its PUT and the GET of the next task count for this task's cycle
            now = time.process_time()
            cpu_by_cycle[cycle] = cpu_by_cycle.get(cycle, 0.0) + now - cpu_t
            cpu_t = now
    finally:
        r.close()
        Path(a.out).write_text(json.dumps({"tasks": tasks, "put_s": r.put_s, "get_s": r.get_s,
                                           "ready_in_cycle_s": ready_in_cycle, "model_s": model_s,
                                           "cpu_s": time.process_time() - cpu0,
                                           "cpu_by_cycle": {str(k): v for k, v in cpu_by_cycle.items()}}))
    return 0


# -- the raw pyzmq baseline ---------------------------------------------------------------------


def _raw_recv(a: argparse.Namespace) -> int:
    """A receiver: its share of a state; answers b"put" (the frame) with b"ok", b"get" with the share."""
    import zmq

    ctx = zmq.Context.instance()
    coord = ctx.socket(zmq.DEALER)
    coord.connect(a.coord)
    data = ctx.socket(zmq.ROUTER)
    data.setsockopt(zmq.LINGER, 0)
    port = data.bind_to_random_port("tcp://127.0.0.1")
    share = np.full(a.count, 1.5)  # its pages are touched once, before the clock starts
    coord.send_multipart([b"recv", str(a.index).encode(), f"tcp://127.0.0.1:{port}".encode()])
    poller = zmq.Poller()
    poller.register(coord, zmq.POLLIN)
    poller.register(data, zmq.POLLIN)
    while True:
        ready = dict(poller.poll())
        if data in ready:
            ident, op, *rest = data.recv_multipart(copy=False)
            if op.bytes == b"get":
                data.send_multipart([ident, b"data", share], copy=False)
            else:
                if rest and rest[0].buffer.nbytes != a.count * 8:
                    raise SystemExit(f"raw receiver: got {rest[0].buffer.nbytes} bytes, expected {a.count * 8}")
                data.send_multipart([ident, b"ok"])
        if coord in ready:
            if coord.recv() == b"stop":
                break
            coord.send_multipart([b"cpu", str(time.process_time()).encode()])
    data.close(0)
    coord.close(0)
    return 0


def _raw_send(a: argparse.Namespace) -> int:
    """A sender: per task, PUT its share to every receiver and wait for the replies, then GET them."""
    import zmq

    ctx = zmq.Context.instance()
    coord = ctx.socket(zmq.DEALER)
    coord.connect(a.coord)
    coord.send_multipart([b"send", str(a.index).encode()])
    addrs = json.loads(coord.recv())
    counts = [int(c) for c in a.counts.split(",")]
    state = np.full(sum(counts), 2.5)
    views, off = [], 0
    for c in counts:
        views.append(state[off:off + c])
        off += c
    socks = []
    for addr in addrs:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addr)
        s.send(b"put")  # a first round trip: the connection is up before the clock starts
        s.recv()
        socks.append(s)
    coord.send(b"ready")
    while True:
        msg = coord.recv()
        if msg == b"stop":
            break
        cpu = time.process_time()
        for _ in range(int(msg)):
            for s, v in zip(socks, views):
                s.send_multipart([b"put", v], copy=False)
            for s in socks:
                s.recv()
            for s in socks:
                s.send(b"get")
            for s, c in zip(socks, counts):
                _, frame = s.recv_multipart(copy=False)
                if frame.buffer.nbytes != c * 8:
                    raise SystemExit(f"raw sender: got {frame.buffer.nbytes} bytes, expected {c * 8}")
        coord.send_multipart([b"done", str(time.process_time() - cpu).encode()])
    for s in socks:
        s.close(0)
    coord.close(0)
    return 0


def raw_zmq(n: int, ranks: int, senders: int, members: int, rounds: int, env: dict,
            timeout_s: float) -> tuple[list[float], list[float]]:
    """The raw baseline's seconds of each of ``rounds`` timed rounds (after one warm-up round), and the
    CPU seconds of each (every sender and receiver process)."""
    import zmq

    from enkflow.parallel import RowBlocks

    counts = [b - a for a, b in (RowBlocks(n, ranks).bounds(r) for r in range(ranks))]
    ctx = zmq.Context.instance()
    coord = ctx.socket(zmq.ROUTER)
    coord.setsockopt(zmq.LINGER, 0)
    caddr = f"tcp://127.0.0.1:{coord.bind_to_random_port('tcp://127.0.0.1')}"
    me = [sys.executable, "-m", "enkflow.online.bench"]
    procs = [subprocess.Popen([*me, "raw-recv", "--coord", caddr, "--index", str(r), "--count", str(counts[r])], env=env)
             for r in range(ranks)]
    deadline = time.monotonic() + timeout_s

    def recv() -> list[bytes]:
        while not coord.poll(200):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise EnkflowError("the raw pyzmq baseline's processes stopped or did not answer in time")
        return coord.recv_multipart()

    try:
        receivers: dict[int, tuple[bytes, str]] = {}
        while len(receivers) < ranks:
            ident, _, idx, addr = recv()
            receivers[int(idx)] = (ident, addr.decode())
        addrs = json.dumps([receivers[r][1] for r in range(ranks)]).encode()
        procs += [subprocess.Popen([*me, "raw-send", "--coord", caddr, "--index", str(i),
                                    "--counts", ",".join(map(str, counts))], env=env) for i in range(senders)]
        idents = []
        while len(idents) < senders:
            ident, *msg = recv()
            if msg[0] == b"send":
                coord.send_multipart([ident, addrs])
            elif msg[0] == b"ready":
                idents.append(ident)
        def receivers_cpu() -> float:
            for r in range(ranks):
                coord.send_multipart([receivers[r][0], b"cpu"])
            return sum(float(recv()[2]) for _ in range(ranks))

        times, cpus = [], []
        for rnd in range(rounds + 1):
            share = [members // senders + (1 if i < members % senders else 0) for i in range(senders)]
            c0 = receivers_cpu()
            t0 = time.perf_counter()
            for ident, k in zip(idents, share):
                coord.send_multipart([ident, str(k).encode()])
            sent_cpu = sum(float(recv()[2]) for _ in range(senders))
            dt = time.perf_counter() - t0
            if rnd:
                times.append(dt)
                cpus.append(sent_cpu + receivers_cpu() - c0)
        for ident in idents + [receivers[r][0] for r in range(ranks)]:
            coord.send_multipart([ident, b"stop"])
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        coord.close(0)
    return times, cpus


# -- running the online study -------------------------------------------------------------------


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(k, "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _mpiexec() -> str:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        raise EnkflowError("a server with --ranks > 1 needs mpiexec (pip install mpich)")
    return exe


def online_study(d: Path, *, problem: str, n: int, ranks: int, runners: int, members: int, cycles: int,
                 nsteps: int = 1, check: bool = False, model: str = "zero", seed: int = 0,
                 timeout_s: float = 1800.0, say=lambda m: None) -> dict:
    """Run the server (``ranks`` ranks) of ``problem`` over ``cycles`` cycles with ``runners`` runners
    in ``d``; returns the server's record (``server.json``) with the runners' (``runners``)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "token").write_text(secrets.token_hex(16) + "\n")
    env = child_env()
    me = [sys.executable, "-m", "enkflow.online.bench"]
    argv = [*me, "server", "--dir", str(d), "--problem", problem, "--n", str(n), "--members", str(members),
            "--cycles", str(cycles), "--nsteps", str(nsteps), "--seed", str(seed), "--runners", str(runners)]
    argv += ["--check"] if check else []
    if ranks > 1:
        argv = [_mpiexec(), "-n", str(ranks), *argv]
    deadline = time.monotonic() + timeout_s
    with open(d / "server.log", "wb") as log:
        server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    procs: list[subprocess.Popen] = []
    try:
        while not (d / "address").exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise EnkflowError(f"the benchmark server did not start; {_tail(d / 'server.log')}")
            time.sleep(0.02)
        address = (d / "address").read_text().strip()
        for i in range(runners):
            with open(d / f"runner-{i}.log", "wb") as log:
                procs.append(subprocess.Popen([*me, "runner", "--address", address, "--token-file", str(d / "token"),
                                               "--n", str(n), "--model", model, "--out", str(d / f"runner-{i}.json")]
                                              + (["--check"] if check else []), env=env, stdout=log, stderr=subprocess.STDOUT))
        say(f"  server ({ranks} rank(s)) at {address}, {runners} runners started")
        while server.poll() is None:
            if time.monotonic() > deadline:
                raise EnkflowError(f"the benchmark server did not finish within {timeout_s:g} s")
            if procs and all(p.poll() not in (None, 0) for p in procs):
                raise EnkflowError(f"every runner failed; {_tail(d / 'runner-0.log')}")
            time.sleep(0.05)
        if server.returncode != 0:
            raise EnkflowError(f"the benchmark server failed (exit {server.returncode}); {_tail(d / 'server.log')}")
        stopped = 0
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # Not told STOP (it asked for work after the server's grace period) and waiting for the
                # server to come back: the study is complete, so end it as enkflow's supervisor does.
                p.terminate()
                p.wait(timeout=30)
                stopped += 1
                continue
            if p.returncode != 0:
                raise EnkflowError(f"runner {i} failed (exit {p.returncode}); {_tail(d / f'runner-{i}.log')}")
    finally:
        for p in [server, *procs]:
            if p.poll() is None:
                p.kill()
                p.wait()
    rec = json.loads((d / "server.json").read_text())
    rec["runners"] = [json.loads((d / f"runner-{i}.json").read_text()) for i in range(runners)]
    rec["runners_terminated"] = stopped
    return rec


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return f"{path} ends with:\n" + log_tail(path, lines, 4000)
    except OSError:
        return f"no log {path}"


def verify(rec: dict, members: int, cycles: int) -> list[str]:
    """With ``--check``: the problems found in the exchanged data (empty: all right)."""
    problems = []
    init = rec["initial"]
    analyses = {int(k): v for k, v in rec["analyses"].items()}
    forecasts = {int(k): v for k, v in rec["forecasts"].items()}
    sent: dict[tuple[int, int], set[int]] = {}
    seen = set()
    for r in rec["runners"]:
        for cycle, member, got, put in r["tasks"]:
            want = init[member - 1] if cycle == 1 else analyses.get(cycle - 1, [None] * members)[member - 1]
            if got != want:
                problems.append(f"cycle {cycle}, member {member}: the runner got another state than the server held")
            sent.setdefault((cycle, member), set()).add(put)
            seen.add((cycle, member))
    for k in range(1, cycles + 1):
        for m in range(1, members + 1):
            if (k, m) not in seen:
                problems.append(f"cycle {k}, member {m}: no runner ran it")
            elif forecasts.get(k, [None] * members)[m - 1] not in sent[(k, m)]:
                problems.append(f"cycle {k}, member {m}: the analysis saw another forecast than the runner sent")
    return problems


# -- the benchmarks -----------------------------------------------------------------------------


def _demo_compare(d: Path, members: int, cycles: int, runners: int, seed: int, say) -> dict:
    """The demo problem offline and online: seconds per cycle (event log) and wall seconds of each."""
    import netCDF4

    from enkflow.experiment.config import load_experiment
    from enkflow.experiment.demo import DemoSettings, prepare
    from enkflow.experiment.driver import Experiment
    from enkflow.jobs.events import iter_events
    from enkflow.online.launch import OnlineExperiment

    out: dict = {}
    means = {}
    for mode in ("offline", "online"):
        sub = d / mode
        sub.mkdir(parents=True)
        s = DemoSettings(members=members, cycles=cycles, seed=seed, mode=mode, runners=runners, workers=runners)
        cfg = load_experiment(prepare(sub, s, lambda m: None))
        t0 = time.perf_counter()
        (OnlineExperiment(cfg) if mode == "online" else Experiment(cfg)).run()
        wall = time.perf_counter() - t0
        starts, ends = {}, {}
        for e in iter_events(cfg.expdir / "events.jsonl"):
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
            with netCDF4.Dataset(cfg.cycle_dir(k) / "analysis_mean.nc") as ds:
                means[mode].append(np.asarray(ds["soil_moisture"][:]))
    out["online_equals_offline"] = all(np.array_equal(a, b) for a, b in zip(means["offline"], means["online"]))
    return out


def run_online(args: argparse.Namespace) -> int:
    """``enkflow bench online``."""
    for name in ("ranks", "runners", "members", "cycles"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1", item=name)
    if args.state_mb <= 0:
        raise InputError("--state-mb must be > 0", item="state_mb")
    n = max(1, int(round(args.state_mb * 1e6 / 8)))
    state_bytes = 8 * n
    moved = 2 * args.members * args.cycles * state_bytes
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(args.dir) if args.dir else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="enkflow-bench-online-", dir=base))
    env = child_env()
    try:
        say(f"bench online: {args.members} members of {state_bytes / 1e6:g} MB, {args.ranks} server rank(s), "
            f"{args.runners} runners, {args.cycles} cycle(s) (+1 warm-up)")
        say("raw pyzmq baseline ...")
        raw_runs, raw_cpus = [], []
        t, c = raw_zmq(n, args.ranks, args.runners, args.members, args.cycles, env, args.timeout)
        raw_runs.append(t)
        raw_cpus.append(c)
        say("online exchange ...")
        rec = online_study(d / "exchange", problem="exchange", n=n, ranks=args.ranks, runners=args.runners,
                           members=args.members, cycles=args.cycles + 1, check=args.check, timeout_s=args.timeout, say=say)
        say("raw pyzmq baseline again ...")
        t, c = raw_zmq(n, args.ranks, args.runners, args.members, args.cycles, env, args.timeout)
        raw_runs.append(t)
        raw_cpus.append(c)
        best = min(range(2), key=lambda i: sum(raw_runs[i]))  # the faster run: the baseline is not the one slowed down
        raw_times = raw_runs[best]
        diag = {int(k): v for k, v in rec["diagnostics"].items()}
        timed = [diag[k]["forecast_s"] for k in sorted(diag)[1:]]
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
                   tasks=sum(diag[k]["tasks"] for k in sorted(diag)[1:]),
                   server_transfer_s=[diag[k]["transfer_s"] for k in sorted(diag)[1:]],
                   server_forecast_cpu_s=[rec["forecast_cpu_s"][str(k)] for k in sorted(diag)[1:]],
                   # CPU seconds per cycle (round) of every process of each side: where the cores are busy
                   # anyway, the ratio of the rates follows the ratio of these
                   exchange_cpu_s=[sum(rec["forecast_cpu_s"][str(k)]) + sum(r["cpu_by_cycle"].get(str(k), 0.0)
                                                                           for r in rec["runners"]) for k in sorted(diag)[1:]],
                   raw_cpu_s=raw_cpus[best], runners_terminated=rec["runners_terminated"])
        if args.check:
            problems = verify(rec, args.members, args.cycles + 1)
            res["data_ok"] = not problems
            res["data_problems"] = problems[:10]
        if not args.no_compare:
            say("demo problem, offline and online ...")
            res.update(_demo_compare(d / "demo", args.members, args.cycles, args.runners, args.seed, say))
        else:
            res.update(seconds_per_cycle_online=None, seconds_per_cycle_offline=None)
        res.update(state_mb=state_bytes / 1e6, ranks=args.ranks, runners=args.runners, members=args.members,
                   cycles=args.cycles, check=bool(args.check), cpus=os.cpu_count())
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
        else:
            say(f"files kept in {d}")
    print(_online_table(res))
    if args.json:
        print(json.dumps(res))
    return 0 if res.get("data_ok", True) else 1


def _online_table(r: dict) -> str:
    gb = r["bytes_moved"] / 1e9
    lines = [
        f"online state exchange: {r['members']} members x {r['state_mb']:g} MB, {r['ranks']} server rank(s), "
        f"{r['runners']} runners, {r['cycles']} timed cycle(s); {gb:.2f} GB moved (both directions)",
        f"  {'':28s}{'seconds':>10s}{'GB/s':>10s}",
        f"  {'raw pyzmq (same streams)':28s}{sum(r['raw_round_s']):10.3f}{r['raw_zmq_gbps']:10.3f}",
        f"  {'enkflow online exchange':28s}{sum(r['exchange_forecast_s']):10.3f}{r['exchange_gbps']:10.3f}",
        f"  ratio exchange / raw: {r['ratio']:.2f} (target >= 0.8); best cycle / best round: {r['ratio_best']:.2f}",
        f"  CPU seconds per cycle, every process: raw {sum(r['raw_cpu_s']) / len(r['raw_cpu_s']):.2f}, "
        f"exchange {sum(r['exchange_cpu_s']) / len(r['exchange_cpu_s']):.2f} (server ranks "
        f"{sum(map(sum, r['server_forecast_cpu_s'])) / len(r['server_forecast_cpu_s']):.2f}) on {r['cpus']} CPUs",
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


def run_scale(args: argparse.Namespace) -> int:
    """``enkflow bench online-scale``."""
    for name in ("ranks", "runners", "members", "cycles"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be >= 1", item=name)
    if args.members < 2:
        raise InputError("--members must be >= 2", item="members")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(args.dir) if args.dir else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="enkflow-bench-online-scale-", dir=base))
    try:
        say(f"bench online-scale: {args.members} Lorenz-96 members, {args.runners} runners, {args.ranks} server rank(s), "
            f"{args.cycles} cycle(s) (+1 warm-up), model {args.model}")
        t0 = time.perf_counter()
        rec = online_study(d, problem="l96", n=40, ranks=args.ranks, runners=args.runners, members=args.members,
                           cycles=args.cycles + 1, check=args.check, model=args.model, seed=args.seed,
                           timeout_s=args.timeout, say=say)
        wall = time.perf_counter() - t0
        diag = {int(k): v for k, v in rec["diagnostics"].items()}
        ks = sorted(diag)[1:]
        fs = sum(diag[k]["forecast_s"] for k in ks)
        exchanges = args.members * len(ks)
        timed = [t for r in rec["runners"] for t in r["tasks"] if t[0] in ks]
        runners = rec["runners"]
        cpu = rec["forecast_cpu_s"]
        ntasks = max(1, sum(len(r["tasks"]) for r in runners))
        res = {
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
            "runner_put_ms_per_member": 1e3 * sum(r["put_s"] for r in runners) / max(1, sum(len(r["tasks"]) for r in runners)),
            "runner_get_ms_per_member": 1e3 * sum(r["get_s"] for r in runners) / max(1, sum(len(r["tasks"]) for r in runners)),
            "runner_wait_ms_per_member": 1e3 * sum(r["ready_in_cycle_s"] for r in runners)
            / max(1, sum(len(r["tasks"]) for r in runners)),
            "runner_model_ms_per_member": 1e3 * sum(r["model_s"] for r in runners) / max(1, sum(len(r["tasks"]) for r in runners)),
            "tasks_per_runner": [len(r["tasks"]) for r in runners],
            "timed_tasks": len(timed),
            "runners_terminated": rec["runners_terminated"],
            "wall_s": wall,
            "members": args.members, "runners": args.runners, "ranks": args.ranks, "cycles": args.cycles,
            "model": args.model, "method": "etkf", "cpus": os.cpu_count(),
        }
        if args.check:
            problems = verify(rec, args.members, args.cycles + 1)
            res["data_ok"] = not problems
            res["data_problems"] = problems[:10]
    finally:
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)
        else:
            say(f"files kept in {d}")
    print(_scale_table(res))
    if args.json:
        print(json.dumps(res))
    return 0 if res.get("data_ok", True) else 1


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


# -- the processes ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enkflow.online.bench", description="processes of enkflow bench online")
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--dir", required=True)
    s.add_argument("--problem", choices=["exchange", "l96"], required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--members", type=int, required=True)
    s.add_argument("--cycles", type=int, required=True)
    s.add_argument("--nsteps", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--runners", type=int, default=1, help="hand out no member before this many runners joined")
    s.add_argument("--check", action="store_true")
    s.set_defaults(func=_serve)
    r = sub.add_parser("runner")
    r.add_argument("--address", required=True)
    r.add_argument("--token-file", required=True)
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--model", choices=["zero", "l96"], default="zero")
    r.add_argument("--out", required=True)
    r.add_argument("--check", action="store_true")
    r.set_defaults(func=_runner)
    rr = sub.add_parser("raw-recv")
    rr.add_argument("--coord", required=True)
    rr.add_argument("--index", type=int, required=True)
    rr.add_argument("--count", type=int, required=True)
    rr.set_defaults(func=_raw_recv)
    rs = sub.add_parser("raw-send")
    rs.add_argument("--coord", required=True)
    rs.add_argument("--index", type=int, required=True)
    rs.add_argument("--counts", required=True)
    rs.set_defaults(func=_raw_send)
    a = p.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
