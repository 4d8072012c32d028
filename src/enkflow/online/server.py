"""The assimilation server: owns the ensemble in memory, feeds runners, runs the analysis.

Every server rank (an MPI program: ``mpiexec -n P enkflow serve ...``) owns a
row block of every member (:class:`~enkflow.online.store.MemoryStore`) and
binds a *data* socket, through which runner ranks send and fetch exactly the
elements that rank owns (N-to-M, no gather through one process). Rank 0 also
binds the *control* socket (HELLO, READY/TASK, heartbeats) and schedules
(:class:`~enkflow.online.scheduler.Scheduler`); the ranks coordinate over an
internal *bus* (rank 0 ROUTER, the others DEALER): a rank reports that its
part of a task's forecast arrived complete and valid, rank 0 accepts the task
once every rank has its part and tells every rank to move the staged frames
into the member's columns (a result that is no longer current is dropped, so
results are idempotent). Once every member's forecast is in, every rank
leaves the forecast phase and the same :func:`~enkflow.experiment.cycling.analyse`
as offline mode runs, collectively over the server's communicator.

Each rank's loop is single-threaded (ZeroMQ sockets are not thread-safe);
checkpoints are written by a background thread (:mod:`enkflow.online.checkpoint`).
"""

from __future__ import annotations

import hmac
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from enkflow.errors import EnkflowError, MemberError
from enkflow.experiment.cycling import ObservationSpace, run_cycles
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.jobs.events import EventLog
from enkflow.online import checkpoint as ckpt
from enkflow.online.fields import Field, Ownership, describe_mismatch
from enkflow.online.scheduler import Scheduler, SchedulerConfig
from enkflow.online.store import MemoryStore
from enkflow.online.wire import (
    Header, Kind, ProtocolError, credential, decode_index, decode_json, encode_index, encode_json,
)
from enkflow.parallel import Comm, SerialComm


@dataclass(frozen=True)
class ServerConfig:
    """Where and how the server listens; times in seconds.

    ``bind`` is the interface (loopback unless set), ``port`` the control port
    (0: any free port; the address is written to ``address_file``).
    ``curve_secret_key`` (Z85) turns on ZeroMQ CURVE encryption; runners then
    need the matching public key. ``stateless_check``: in the first cycle of a new
    study member 1 runs twice and the two forecasts must agree bit for bit (a
    model keeping state between exposes would give members the wrong history).
    ``min_runners``: hand out no member before this many runners have joined (for
    benchmarks and tests that need every runner to take part). ``stop_file`` is written
    once the last cycle is done, before runners are told to stop (so that a supervisor
    does not replace a runner that stopped because the study is over).
    """

    token: str
    bind: str = "127.0.0.1"
    port: int = 0
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 10.0
    scheduler: SchedulerConfig = SchedulerConfig()
    checkpoint_dir: Path | None = None
    curve_secret_key: str | None = None
    address_file: Path | None = None
    stateless_check: bool = False
    min_runners: int = 1
    stop_file: Path | None = None


@dataclass
class Problem:
    """What the server assimilates.

    ``fields``: a member's fields (runners must declare exactly these);
    ``initial(store)`` fills the store's shares with the initial ensemble;
    ``nsteps(cycle)`` the model steps of a cycle's forecast; ``obs``: the observations;
    ``step``: the analysis (:func:`~enkflow.experiment.step.build_step` makes it from the
    configuration), which every server rank runs collectively once the forecasts are in.
    """

    fields: tuple[Field, ...]
    n_members: int
    initial: Callable[[MemoryStore], None]
    nsteps: Callable[[int], int]
    obs: ObservationSpace
    step: AnalysisStep


# Bus operations between server ranks.
_PART_DONE, _PART_REJECT, _ACCEPT, _DROP, _END_FORECAST, _STOP, _COMPARE, _SAME, _DIFFER = range(1, 10)
_BUS = struct.Struct("<Hqqqq")  # op, task, member, cycle, rank


@dataclass
class _Runner:
    id: int
    identity: bytes
    name: str
    last_seen: float
    waiting_since: float | None = None


@dataclass
class _Staged:
    member: int
    cycle: int
    pieces: list[tuple[int, int, int, zmq.Frame]] = field(default_factory=list)
    covered: list[list[tuple[int, int]]] = field(default_factory=list)


def _advertised(endpoint: str) -> str:
    """An address runners can connect to (a wildcard bind is advertised with this host's name)."""
    host, _, port = endpoint.rpartition(":")
    if host in ("tcp://0.0.0.0", "tcp://*", "tcp://[::]"):
        return f"tcp://{socket.gethostname()}:{port}"
    return endpoint


class _Propagator:
    """The forecast phase as a :class:`~enkflow.experiment.cycling.Propagator`: serve runners until
    every member's forecast of the cycle is in (the first cycle may start with some recovered)."""

    def __init__(self, server: "Server", first: int | None, recovered: set[int]):
        self.server, self.first, self.recovered = server, first, recovered

    def forecast(self, cycle: int) -> None:
        self.server._forecast(cycle, self.recovered if cycle == self.first else set())


class Server:
    """One rank of the assimilation server; every rank of ``comm`` constructs one and calls :meth:`run`."""

    def __init__(self, problem: Problem, config: ServerConfig, *, comm: Comm | None = None,
                 events: EventLog | None = None, progress: Callable[[str], None] | None = None):
        self.p = problem
        self.cfg = config
        self.comm = comm or SerialComm()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.events = events if self.rank == 0 else None
        self._data_log = events  # every rank logs what its data socket refuses
        self.progress = progress if self.rank == 0 else None
        self.own = Ownership(tuple(problem.fields), self.size)
        # Ranks that own elements: a task is complete once each of them has its part.
        self.active = [r for r in range(self.size) if any(a < b for a, b in self.own.table()[r])]
        self.cred = credential(config.token)
        # One incarnation number for all ranks: data messages must carry the one the runner was welcomed with.
        self.epoch = self.comm.bcast(int.from_bytes(np.random.default_rng().bytes(7), "little") or 1, root=0)
        self.ckpt = ckpt.Checkpointer(config.checkpoint_dir, self.rank, self.own.fields, self.size) if config.checkpoint_dir else None
        self.store = MemoryStore(self.own, self.comm, problem.n_members, checkpointer=self.ckpt)
        self.cycle = -1
        self._kept: dict[int, list[np.ndarray]] = {}
        self.staged: dict[int, _Staged] = {}
        self.sched = Scheduler(problem.n_members, config.scheduler)
        self.runners: dict[int, _Runner] = {}
        self.waiting: deque[int] = deque()
        self._dispatched = False
        self._idle = 0.0  # runners' waits for a task reported this cycle, seconds
        self.stats: dict[str, float] = {}
        self.diagnostics: dict[int, dict[str, float]] = {}
        self._ctx = zmq.Context.instance()
        self._open_sockets()

    # -- sockets ------------------------------------------------------------------------

    def _bind(self, kind: int, port: int = 0, host: str | None = None, max_message: int = -1) -> zmq.Socket:
        s = self._ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, max_message)
        s.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self.cfg.curve_secret_key and host is None:
            s.curve_server = True
            s.curve_secretkey = self.cfg.curve_secret_key.encode()
        h = host or self.cfg.bind
        if port:
            s.bind(f"tcp://{h}:{port}")
        else:
            s.bind_to_random_port(f"tcp://{h}")
        return s

    def _open_sockets(self) -> None:
        self.data = self._bind(zmq.ROUTER)
        self.data_addresses = [str(a) for a in self.comm.allgather_obj(_advertised(self.data.LAST_ENDPOINT.decode()))]
        self.control = self.bus = None
        bus_addr = None
        if self.rank == 0:
            # Control messages are small; libzmq drops a peer that sends a larger one before it is buffered.
            self.control = self._bind(zmq.ROUTER, self.cfg.port, max_message=4 << 20)
            self.address = _advertised(self.control.LAST_ENDPOINT.decode())
            if self.size > 1:
                self.bus = self._bind(zmq.ROUTER, host="127.0.0.1")
                bus_addr = self.bus.LAST_ENDPOINT.decode()
        bus_addr = self.comm.bcast(bus_addr, root=0)
        self.address = self.comm.bcast(self.address if self.rank == 0 else None, root=0)
        if self.rank != 0:
            self.bus = self._ctx.socket(zmq.DEALER)
            self.bus.setsockopt(zmq.LINGER, 0)
            self.bus.setsockopt(zmq.IDENTITY, b"rank-%d" % self.rank)
            self.bus.connect(bus_addr)
            self.bus.send_multipart([self.cred, _BUS.pack(0, 0, 0, 0, self.rank)])  # so that rank 0 can route to this rank
        elif self.size > 1:
            registered: set[int] = set()
            while len(registered) < self.size - 1:
                msg = self._bus_message(self.bus.recv_multipart())
                if msg is not None and msg[0] == 0:
                    registered.add(msg[4])
        self.comm.barrier()
        if self.rank == 0 and self.cfg.address_file is not None:
            from enkflow.fsutil import write_bytes_atomic

            write_bytes_atomic(self.cfg.address_file, (self.address + "\n").encode())

    def close(self) -> None:
        for s in (self.data, self.control, self.bus):
            if s is not None:
                # Time for the last replies (STOP, the ERROR that ended a study) to leave on a loaded
                # machine; a ROUTER drops what is queued for a peer that is gone, so this waits only
                # for live, slow peers.
                s.close(linger=3000)
        if self.ckpt is not None:
            self.ckpt.close()

    # -- the study ---------------------------------------------------------------------

    def _emit(self, event: str, **kw: object) -> None:
        if self.events is not None:
            self.events.emit(event, **kw)

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    def run(self, cycles: list[int]) -> dict[int, dict[str, float]]:
        """Run ``cycles`` (resuming from the checkpoints when there are); returns each cycle's diagnostics."""
        try:
            todo, done_members = self._recover(cycles)
            self._emit("online_start", cycles=todo, members=self.p.n_members, ranks=self.size, address=self.address,
                       resumed=todo != list(cycles), recovered_forecasts=sorted(done_members))
            self._probe = 1 if self.cfg.stateless_check and todo and todo[0] == cycles[0] and not done_members else None
            # The repeat run of the probe member must start from the state the first run started from.
            self._kept = ({self._probe: [self.store.column(k, self._probe).copy() for k in range(len(self.own.fields))]}
                          if self._probe is not None else {})
            run_cycles(todo, _Propagator(self, todo[0] if todo else None, done_members), self._analysis)
            self._finish()
        except BaseException:
            if self.rank == 0 and self.control is not None:
                self._stop_runners()
            raise
        finally:
            self.close()
        return self.diagnostics

    def _recover(self, cycles: list[int]) -> tuple[list[int], set[int]]:
        """Load the newest complete checkpoint; returns the cycles left and the forecasts already in."""
        info = None
        if self.rank == 0 and self.cfg.checkpoint_dir is not None:
            info = ckpt.recoverable(self.cfg.checkpoint_dir, self.size, self.p.n_members)
        last, forecasts = self.comm.bcast(info, root=0) or (None, {})
        shapes = [p.shape for p in self.store.parts]
        if last is not None and last >= cycles[0]:
            for dst, src in zip(self.store.parts, ckpt.read_h5(ckpt.analysis_path(self.cfg.checkpoint_dir, last, self.rank),
                                                              self.own.fields, shapes)):
                dst[...] = src
            todo = [k for k in cycles if k > last]
            self._say(f"resumed from the checkpoint of cycle {last}'s analysis")
        else:
            self.p.initial(self.store)
            todo = list(cycles)
        done: set[int] = set()
        if todo and self.cfg.checkpoint_dir is not None:
            done = set(forecasts.get(todo[0], set()))
            for m in sorted(done):
                path = ckpt.forecast_path(self.cfg.checkpoint_dir, todo[0], m, self.rank)
                cols = ckpt.read_h5(path, self.own.fields, [(s[0],) for s in shapes])
                for k, c in enumerate(cols):
                    self.store.column(k, m)[...] = c
            if done:
                self._say(f"cycle {todo[0]}: {len(done)} forecasts recovered from the checkpoints")
        return todo, done

    def _analysis(self, k: int) -> dict[str, float | list[float]]:
        t0 = time.perf_counter()
        error = None
        if self.ckpt is not None:
            try:
                self.ckpt.flush()  # the forecast checkpoints read the shares the analysis overwrites
            except Exception as exc:  # noqa: BLE001 - agreed on below, then raised on every rank
                error = f"server rank {self.rank}: {exc}"
        # A checkpoint's failure (or what it waited for: the mean and spread files) on one rank stops
        # every rank here, before the analysis's collectives, where the others would wait for ever.
        errors = [e for e in self.comm.allgather_obj(error) if e is not None]
        if errors:
            raise EnkflowError("; ".join(errors))
        t_flush = time.perf_counter() - t0
        _, analysed = analyse(self.p.step, self.store, self.p.obs, k)
        transfer = self.comm.allgather_obj(self.stats.get("transfer_s", 0.0))
        diag = {**analysed.as_dict(), **{k2: v for k2, v in self.stats.items() if k2 != "transfer_s"},
                "transfer_s": float(max(transfer)), "checkpoint_wait_s": t_flush}
        self.diagnostics[k] = diag
        self._emit("online_cycle_end", cycle=k, **diag)
        self._emit("cycle_end", cycle=k)
        # Last: a restarted server skips every cycle whose analysis is checkpointed, so the cycle's
        # outputs (mean and spread files, events) must exist before its checkpoint does; the output
        # may write them in the background; its ``wait`` says when they are written.
        self.store.checkpoint(k, after=self.p.step.output.wait)
        self._say(f"cycle {k}: analysis done ({analysed.analysis_s:.2f} s), omb {analysed.omb_rms:.4g} -> oma "
                  f"{analysed.oma_rms:.4g}")
        if self.rank == 0:
            now = time.monotonic()
            for r in self.runners.values():  # they could not be heard during the analysis
                r.last_seen = now
        return diag

    # -- the forecast phase ---------------------------------------------------------------

    def _forecast(self, k: int, done: set[int]) -> None:
        self.cycle = k
        self.staged.clear()
        self.stats = {"transfer_s": 0.0}
        t0 = time.perf_counter()
        if self.rank == 0:
            self._emit("cycle_start", cycle=k)
            self.sched.start_cycle(k, done, probe=self._probe)
            probes = 1 if self._probe is not None else 0
            self._probe = None
            self._compared: set[int] = set()
            self._idle = 0.0
            self._serve_rank0()
            self.stats.update(forecast_s=time.perf_counter() - t0, runner_idle_s=self._idle,
                              tasks=float(self.sched.assigned), recomputed=float(self.sched.assigned - (self.p.n_members - len(done)) - probes),
                              recovered=float(len(done)), runners=float(len(self.runners)))
            for cause, n in self.sched.redone.items():
                self.stats[f"redone_{cause}"] = float(n)
            for r in range(1, self.size):
                self._bus_send(r, _END_FORECAST, 0, 0, k)
        else:
            self._serve_other()
            self.stats["forecast_s"] = time.perf_counter() - t0

    def _serve_other(self) -> None:
        poller = zmq.Poller()
        poller.register(self.data, zmq.POLLIN)
        poller.register(self.bus, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(1000))
            if self.data in ready:
                self._on_data(self.data.recv_multipart(copy=False))
            if self.bus in ready:
                frames = self.bus.recv_multipart()
                op, task, member, cycle, _ = _BUS.unpack(frames[0])
                if op == _END_FORECAST and cycle == self.cycle:
                    return
                if op == _STOP:
                    raise EnkflowError(frames[1].decode() if len(frames) > 1 else "the server stopped")
                self._on_bus(op, task, member, cycle)

    def _serve_rank0(self) -> None:
        poller = zmq.Poller()
        for s in (self.control, self.data, self.bus):
            if s is not None:
                poller.register(s, zmq.POLLIN)
        last_check = 0.0
        self._dispatch()
        while not self.sched.complete:
            ready = dict(poller.poll(200))
            if self.control in ready:
                for _ in range(256):
                    try:
                        self._on_control(self.control.recv_multipart(zmq.NOBLOCK, copy=False))
                    except zmq.Again:
                        break
            if self.data in ready:
                self._on_data(self.data.recv_multipart(copy=False))
            if self.bus is not None and self.bus in ready:
                msg = self._bus_message(self.bus.recv_multipart())
                if msg is not None:
                    self._on_report(*msg)
            now = time.monotonic()
            if now - last_check > 0.2:
                last_check = now
                self._check_liveness(now)
            self._dispatch()

    # -- rank 0: control ----------------------------------------------------------------

    def _reply(self, identity: bytes, hdr: Header, *frames: object) -> None:
        self.control.send_multipart([identity, hdr.pack(), *frames], copy=False)

    def _error(self, sock: zmq.Socket, identity: bytes, hdr: Header | None, message: str) -> None:
        h = (hdr or Header(Kind.ERROR)).reply(Kind.ERROR, epoch=self.epoch)
        sock.send_multipart([identity, h.pack(), encode_json({"error": message})])

    def _on_control(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            hdr = Header.unpack(frames[1].buffer) if len(frames) > 1 else Header.unpack(b"")
        except ProtocolError as exc:
            self._emit("online_reject", reason=str(exc))
            self._error(self.control, identity, None, str(exc))
            return
        if not hmac.compare_digest(hdr.credential, self.cred):
            if hdr.kind is not Kind.HEARTBEAT:
                self._emit("online_reject", reason="wrong token", runner=hdr.runner)
                self._error(self.control, identity, hdr, "authentication failed: wrong token")
            return
        now = time.monotonic()
        r = self.runners.get(hdr.runner)
        if hdr.kind is Kind.HELLO:
            self._hello(identity, hdr, frames[2:], now)
            return
        if r is None:
            if hdr.kind in (Kind.READY, Kind.FAIL):
                self._error(self.control, identity, hdr, "unknown runner (it was declared lost or the server restarted): "
                                                         "greet the server again (HELLO)")
            return
        r.last_seen = now
        if hdr.kind is Kind.HEARTBEAT:
            return
        if hdr.kind is Kind.READY:
            r.identity = identity
            if 0 <= hdr.nsteps < 10**13:  # the runner's wait for its previous task, microseconds
                self._idle += hdr.nsteps / 1e6
            if r.waiting_since is None:
                r.waiting_since = now
                self.waiting.append(r.id)
        elif hdr.kind is Kind.FAIL:
            try:
                msg = decode_json(frames[2].buffer, "fail").get("error", "?") if len(frames) > 2 else "?"
            except ProtocolError as exc:
                self._emit("online_reject", reason=f"bad FAIL: {exc}", runner=r.name)
                self._error(self.control, identity, hdr, f"bad FAIL: {exc}")
                return
            t = self.sched.current(hdr.task, hdr.cycle)
            if t is not None and t.runner == r.id:
                self._requeue(t.id, "failed", f"runner {r.name}: {msg}")
        elif hdr.kind is Kind.BYE:
            self._drop_runner(r, "left", None)
        else:
            self._error(self.control, identity, hdr, f"unexpected {hdr.kind.name} on the control socket")

    def _hello(self, identity: bytes, hdr: Header, frames: list[zmq.Frame], now: float) -> None:
        try:
            body = decode_json(frames[0].buffer, "hello") if frames else {}
            if not isinstance(body.get("fields", []), list):
                raise ProtocolError(f"'fields' is {type(body['fields']).__name__}, not a list")
            got = [Field.from_json(d) for d in body.get("fields", [])]
            ranks = int(body.get("ranks", 1))
        except (EnkflowError, TypeError, ValueError) as exc:
            self._emit("online_reject", reason=f"bad HELLO: {exc}", runner=hdr.runner)
            self._error(self.control, identity, hdr, f"bad HELLO: {exc}")
            return
        diff = describe_mismatch(list(self.own.fields), got)
        name = str(body.get("name", hdr.runner))[:200]
        if diff:
            self._emit("online_reject", runner=name, reason=diff)
            self._error(self.control, identity, hdr, f"the runner's fields do not match the server's: {diff}")
            return
        old = self.runners.get(hdr.runner)
        if old is not None:
            self._drop_runner(old, "rejoined", None)
        self.runners[hdr.runner] = _Runner(hdr.runner, identity, name, now)
        self._emit("runner_join", runner=name, id=hdr.runner, ranks=ranks)
        welcome = {"epoch": self.epoch, "ranks": self.size, "data": self.data_addresses, "heartbeat_s": self.cfg.heartbeat_s}
        self._reply(identity, hdr.reply(Kind.WELCOME, epoch=self.epoch), encode_json(welcome))

    def _dispatch(self) -> None:
        """Hand pending members to waiting runners (deferred replies to their READY)."""
        now = time.monotonic()
        if len(self.runners) < self.cfg.min_runners and not self._dispatched:
            return
        self._dispatched = True
        while self.waiting and self.sched.pending:
            r = self.runners.get(self.waiting.popleft())
            if r is None or r.waiting_since is None:
                continue
            t = self.sched.assign(r.id, now)
            if t is None:
                self.waiting.appendleft(r.id)
                return
            r.waiting_since = None
            self._reply(r.identity, Header(Kind.TASK, self.cred, r.id, t.id, t.member, t.cycle, self.p.nsteps(t.cycle),
                                           epoch=self.epoch))
            self._emit("task_assign", cycle=t.cycle, member=t.member, task=t.id, runner=r.name)

    def _check_liveness(self, now: float) -> None:
        for r in list(self.runners.values()):
            if now - r.last_seen > self.cfg.heartbeat_timeout_s:
                self._drop_runner(r, "lost", f"runner {r.name} sent no heartbeat for {now - r.last_seen:.1f} s "
                                             "(killed, hung or cut off)")
        for t in self.sched.overdue(now):
            r = self.runners.get(t.runner)
            self._requeue(t.id, "late", f"runner {r.name if r else t.runner} did not finish by the due date "
                                        f"({t.due - t.t_start:.1f} s after it started)")

    def _drop_runner(self, r: _Runner, why: str, error: str | None) -> None:
        self.runners.pop(r.id, None)
        self._emit("runner_" + ("lost" if error else "leave"), runner=r.name, id=r.id, reason=why)
        for t in self.sched.held_by(r.id):
            self._requeue(t.id, why, error)

    def _requeue(self, task_id: int, cause: str, error: str | None) -> None:
        try:
            t = self.sched.requeue(task_id, cause, error)
        except MemberError as exc:
            self._emit("experiment_fail", cycle=self.cycle, member=exc.member, report={"reason": str(exc)})
            raise
        if t is not None:
            self._emit("task_requeue", cycle=t.cycle, member=t.member, task=t.id, reason=cause, error=error)
            self._say(f"cycle {t.cycle}: member {t.member} rescheduled ({cause})")
            for rank in self.active:
                self._bus_send(rank, _DROP, t.id, t.member, t.cycle)

    # -- rank 0: reports from the ranks ----------------------------------------------------

    def _on_report(self, op: int, task: int, member: int, cycle: int, rank: int, reason: str) -> None:
        if op in (_SAME, _DIFFER):
            self._on_compare(op, member, rank, reason)
            return
        t = self.sched.current(task, cycle)
        if t is None or t.member != member:  # stale, or another member's data under this task id
            self._bus_send(rank, _DROP, task, member, cycle)
            return
        if op == _PART_REJECT:
            self._requeue(task, "rejected", f"server rank {rank} rejected the forecast: {reason}")
            return
        t.parts.add(rank)
        if len(t.parts) == len(self.active):
            t = self.sched.finish(task, time.monotonic())
            if t.repeat:
                for r in self.active:
                    self._bus_send(r, _COMPARE, task, member, cycle)
                return
            for r in self.active:
                self._bus_send(r, _ACCEPT, task, member, cycle)
            self._emit("task_done", cycle=cycle, member=member, task=task)
            n_done = len(self.sched.done)
            if n_done % max(1, self.p.n_members // 10) == 0 or n_done == self.p.n_members:
                self._say(f"cycle {cycle}: {n_done}/{self.p.n_members} forecasts in")

    def _on_compare(self, op: int, member: int, rank: int, reason: str) -> None:
        """A rank's verdict on the statelessness check: its part of the repeated forecast against the first."""
        if op == _DIFFER:
            self._emit("stateless_check", cycle=self.cycle, member=member, ok=False, reason=reason)
            raise MemberError(f"the model is not stateless: run twice from the same state, member {member} gave different "
                              f"forecasts ({reason}). Runners get any member in turn, so the model must keep no state of "
                              "its own between exposes (set [online] stateless_check = false only if the difference is "
                              "expected, e.g. a stochastic model)", member=member, cycle=self.cycle)
        self._compared.add(rank)
        if len(self._compared) == len(self.active):
            self.sched.probe_resolved()
            self._emit("stateless_check", cycle=self.cycle, member=member, ok=True)

    def _bus_message(self, frames: list[bytes]) -> tuple[int, int, int, int, int, str] | None:
        """Rank 0: a report from another rank (identity, credential, operation, reason), or None for a
        message that is not one. The bus listens on loopback, where any local process can connect."""
        frames = frames[1:]  # after the sender's identity
        if len(frames) in (2, 3) and hmac.compare_digest(frames[0], self.cred) and len(frames[1]) == _BUS.size:
            op, task, member, cycle, rank = _BUS.unpack(frames[1])
            if 0 < rank < self.size:
                return op, task, member, cycle, rank, frames[2].decode(errors="replace") if len(frames) > 2 else ""
        self._emit("online_reject", reason="not a server rank's message", socket="bus", rank=0)
        return None

    def _bus_send(self, rank: int, op: int, task: int, member: int, cycle: int, reason: str = "") -> None:
        """To rank ``rank`` (0: rank 0's own handler) the bus operation ``op``."""
        if rank == self.rank:
            if self.rank == 0 and op in (_PART_DONE, _PART_REJECT, _SAME, _DIFFER):
                self._on_report(op, task, member, cycle, 0, reason)
            else:
                self._on_bus(op, task, member, cycle)
            return
        frames = [_BUS.pack(op, task, member, cycle, self.rank)] + ([reason.encode()] if reason else [])
        if self.rank == 0:
            self.bus.send_multipart([b"rank-%d" % rank, *frames])
        else:
            self.bus.send_multipart([self.cred, *frames])

    def _stop_runners(self) -> None:
        """Tell waiting runners the study is over; the other ranks stop too."""
        for rid in list(self.waiting):
            r = self.runners.get(rid)
            if r is not None and r.waiting_since is not None:
                self._reply(r.identity, Header(Kind.STOP, self.cred, r.id, epoch=self.epoch))
        self.waiting.clear()
        if self.bus is not None:
            for rank in range(1, self.size):
                try:
                    self.bus.send_multipart([b"rank-%d" % rank, _BUS.pack(_STOP, 0, 0, 0, 0), b"the server stopped"],
                                            zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _finish(self, grace_s: float = 1.0) -> None:
        """After the last cycle: STOP to every runner that asks for work during a short grace period."""
        self.comm.barrier()
        if self.rank != 0:
            return
        if self.cfg.stop_file is not None:
            from enkflow.fsutil import write_json_atomic

            write_json_atomic(self.cfg.stop_file, {"cycles": sorted(self.diagnostics)})
        told = {rid for rid in self.waiting if rid in self.runners and self.runners[rid].waiting_since is not None}
        self._stop_runners()
        # The whole grace period, not just until 100 ms pass without a message (a runner whose last ACK
        # came late asks later); it ends early, after 100 ms of quiet for the replies to leave, once
        # every runner that joined has been told.
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.control.poll(100):
                if self.runners.keys() <= told:
                    break
                continue
            frames = self.control.recv_multipart(copy=False)
            try:
                hdr = Header.unpack(frames[1].buffer)
            except (ProtocolError, IndexError):
                continue
            if not hmac.compare_digest(hdr.credential, self.cred):
                continue
            if hdr.kind is Kind.READY:
                self._reply(frames[0].bytes, Header(Kind.STOP, self.cred, hdr.runner, epoch=self.epoch))
                told.add(hdr.runner)
            elif hdr.kind is Kind.BYE:
                told.add(hdr.runner)
        self._emit("experiment_end", cycles=sorted(self.diagnostics))

    # -- every rank: data -------------------------------------------------------------------

    def _on_bus(self, op: int, task: int, member: int, cycle: int) -> None:
        if op == _ACCEPT:
            st = self.staged.pop(task, None)
            if st is None or cycle != self.cycle:
                raise EnkflowError(f"server rank {self.rank}: accepted task {task} (member {member}) is not staged")
            if self.ckpt is not None:
                self.ckpt.wait_analysis()
            for k, off, cnt, frame in st.pieces:
                lo = self.store.ranges[k][0]
                col = self.store.column(k, member)
                col[off - lo:off - lo + cnt] = np.frombuffer(frame.buffer, dtype=col.dtype)
            for tid in [tid for tid, s in self.staged.items() if s.member == member]:
                del self.staged[tid]
            if self.ckpt is not None:
                self.ckpt.forecast(cycle, member, [self.store.column(k, member) for k in range(len(self.own.fields))])
        elif op == _DROP:
            self.staged.pop(task, None)
        elif op == _COMPARE:
            self._kept.pop(member, None)
            st = self.staged.pop(task, None)
            diff = "its part did not arrive" if st is None else None
            for k, off, cnt, frame in (st.pieces if st is not None else []):
                lo = self.store.ranges[k][0]
                first = self.store.column(k, member)[off - lo:off - lo + cnt]
                again = np.frombuffer(frame.buffer, dtype=first.dtype)
                if first.tobytes() != again.tobytes():
                    bad = np.flatnonzero(first.view(f"u{first.itemsize}") != again.view(f"u{first.itemsize}"))
                    i = int(bad[0])
                    diff = f"field {self.own.fields[k].name!r}, element {off + i}: {first[i].item()!r} then {again[i].item()!r}"
                    break
            self._bus_send(0, _DIFFER if diff else _SAME, task, member, cycle, diff or "")

    def _on_data(self, frames: list[zmq.Frame]) -> None:
        t0 = time.perf_counter()
        identity = frames[0].bytes
        try:
            hdr = Header.unpack(frames[1].buffer) if len(frames) > 1 else Header.unpack(b"")
        except ProtocolError as exc:
            self._refuse(identity, None, str(exc))
            return
        if not hmac.compare_digest(hdr.credential, self.cred):
            self._refuse(identity, hdr, "authentication failed: wrong token")
            return
        if hdr.kind in (Kind.PUT, Kind.GET) and hdr.epoch != self.epoch:
            # Meant for an earlier incarnation of this server and delivered to this one when the runner's
            # socket reconnected: its task ids are not this server's. Refused without touching any task;
            # the runner greets again.
            self._refuse(identity, hdr, f"stale {hdr.kind.name}: the runner was welcomed by another incarnation of "
                                        f"the server (epoch {hdr.epoch}, now {self.epoch}); greet again")
            return
        try:
            if hdr.kind is Kind.PUT:
                self._put(identity, hdr, frames[2:])
            elif hdr.kind is Kind.GET:
                self._get(identity, hdr, frames[2:])
            else:
                raise ProtocolError(f"unexpected {hdr.kind.name} on a data socket")
        except ProtocolError as exc:
            self._refuse(identity, hdr, str(exc))
        self.stats["transfer_s"] = self.stats.get("transfer_s", 0.0) + time.perf_counter() - t0

    def _refuse(self, identity: bytes, hdr: Header | None, message: str) -> None:
        """A data message refused: ERROR to the sender, ``online_reject`` in the event log (from any rank)."""
        if self._data_log is not None:
            self._data_log.emit("online_reject", reason=message, socket="data", rank=self.rank,
                                runner=hdr.runner if hdr else None, kind=hdr.kind.name if hdr else None)
        self._error(self.data, identity, hdr, message)

    def _pieces(self, hdr: Header, frames: list[zmq.Frame], with_data: bool) -> np.ndarray:
        """The checked piece index of a PUT/GET: fields known, ranges owned by this rank."""
        if not frames:
            raise ProtocolError("the piece index frame is missing (truncated message)")
        if hdr.count > 4 * len(self.own.fields) * 1024:
            raise ProtocolError(f"{hdr.count} pieces announced; too many")
        idx = decode_index(frames[0].buffer, hdr.count)
        want = 1 + (hdr.count if with_data else 0)
        if len(frames) != want:
            raise ProtocolError(f"{len(frames) - 1} data frames for {hdr.count} announced pieces (truncated or oversize message)")
        if not 1 <= hdr.member <= self.p.n_members:
            raise ProtocolError(f"member {hdr.member} outside 1..{self.p.n_members}")
        for k, off, cnt in idx:
            if not 0 <= k < len(self.own.fields):
                raise ProtocolError(f"field index {k} outside 0..{len(self.own.fields) - 1}")
            lo, hi = self.store.ranges[k]
            if cnt <= 0 or off < lo or off + cnt > hi:
                raise ProtocolError(f"field {self.own.fields[k].name!r}: elements [{off}, {off + cnt}) are not within "
                                    f"[{lo}, {hi}), which server rank {self.rank} owns")
        return idx

    def _put(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        if hdr.cycle != self.cycle:
            # A forecast of another cycle (a late runner): acknowledged and forgotten.
            self.data.send_multipart([identity, hdr.reply(Kind.ACK, epoch=self.epoch).pack()])
            return
        try:
            idx = self._pieces(hdr, frames, with_data=True)
            st = self.staged.get(hdr.task) or _Staged(hdr.member, hdr.cycle, covered=[[] for _ in self.own.fields])
            if st.member != hdr.member:
                raise ProtocolError(f"task {hdr.task} is member {st.member}, not {hdr.member}")
            new = []
            for (k, off, cnt), fr in zip(idx, frames[1:]):
                f = self.own.fields[k]
                if fr.buffer.nbytes != cnt * f.itemsize:
                    raise ProtocolError(f"field {f.name!r}: a frame of {fr.buffer.nbytes} bytes for {cnt} {f.dtype} elements "
                                        f"({cnt * f.itemsize} bytes; truncated or oversize, or another dtype)")
                if any(a < off + cnt and off < b for a, b in st.covered[k]):
                    raise ProtocolError(f"field {f.name!r}: elements [{off}, {off + cnt}) were already sent for this task")
                if f.assimilated or f.dtype.startswith("float"):
                    a = np.frombuffer(fr.buffer, dtype=f.dtype)
                    if not np.isfinite(np.add.reduce(a, dtype=np.float64)):
                        bad = np.flatnonzero(~np.isfinite(a))
                        if bad.size:
                            raise ProtocolError(f"member {hdr.member}, field {f.name!r}: element {off + int(bad[0])} is "
                                                f"{a[bad[0]]} (NaN or Inf in the forecast)")
                new.append((int(k), int(off), int(cnt), fr))
        except ProtocolError as exc:
            self._refuse(identity, hdr, str(exc))  # first: the report may stop the study (max_failures)
            self.staged.pop(hdr.task, None)
            self._bus_send(0, _PART_REJECT, hdr.task, hdr.member, hdr.cycle, str(exc))
            return
        for k, off, cnt, fr in new:
            st.pieces.append((k, off, cnt, fr))
            st.covered[k].append((off, off + cnt))
        self.staged[hdr.task] = st
        self.data.send_multipart([identity, hdr.reply(Kind.ACK, epoch=self.epoch).pack()])
        complete = all(sum(b - a for a, b in st.covered[k]) == hi - lo for k, (lo, hi) in enumerate(self.store.ranges))
        if complete:
            self._bus_send(0, _PART_DONE, hdr.task, hdr.member, hdr.cycle)

    def _get(self, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        if hdr.cycle != self.cycle:
            raise ProtocolError(f"asked for cycle {hdr.cycle}, the server is in cycle {self.cycle}")
        idx = self._pieces(hdr, frames, with_data=False)
        out: list[object] = [identity, hdr.reply(Kind.DATA, epoch=self.epoch).pack(), encode_index(idx)]
        kept = self._kept.get(hdr.member)
        for k, off, cnt in idx:
            lo = self.store.ranges[k][0]
            col = kept[k] if kept is not None else self.store.column(k, hdr.member)
            out.append(col[off - lo:off - lo + cnt])
        self.data.send_multipart(out, copy=False)
