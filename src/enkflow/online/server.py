"""The assimilation server: owns the ensemble in memory, feeds runners, runs the analysis.

Every server rank (an MPI program: ``mpiexec -n P enkflow serve ...``) owns a
row block of every member (:class:`~enkflow.online.store.MemoryStore`) and
binds a *data* socket, through which runner ranks send and fetch exactly the
elements that rank owns (N-to-M, no gather through one process;
:mod:`~enkflow.online.data_plane`). Rank 0 also binds the *control* socket
(HELLO, READY/TASK, heartbeats) and schedules (:mod:`~enkflow.online.control`);
the ranks coordinate over an internal *bus* (:mod:`~enkflow.online.bus`): a
rank reports that its part of a task's forecast arrived complete and valid,
rank 0 accepts the task once every rank has its part and tells every rank to
move the staged frames into the member's columns
(:mod:`~enkflow.online.coordination`). Once every member's forecast is in,
every rank leaves the forecast phase and the same
:func:`~enkflow.experiment.cycling.analyse` as offline mode runs, collectively
over the server's communicator. A study starts from the newest checkpoint
(:mod:`~enkflow.online.recovery`) and may first check that the model is
stateless (:mod:`~enkflow.online.probe`).

Runners on a rank's node exchange through shared memory where they can
(:mod:`~enkflow.online.segments`, ``ServerConfig.transport``): the rank's store
lives in a segment they read members from, and they write forecasts into the
rank's task slots (:mod:`~enkflow.online.slots`); the server unlinks them when
it ends, whichever way.

Each rank's loop is single-threaded (ZeroMQ sockets are not thread-safe);
checkpoints are written by a background thread (:mod:`enkflow.online.checkpoint`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import zmq

from enkflow.errors import ConfigError, EnkflowError
from enkflow.experiment.cycling import ObservationSpace, run_cycles
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.fsutil import write_bytes_atomic, write_json_atomic
from enkflow.jobs.events import EventLog
from enkflow.online import checkpoint as ckpt
from enkflow.netaddr import advertised
from enkflow.online.bus import Bus, BusMessage, BusOp, BusSettings, RankLost
from enkflow.online.control import Control
from enkflow.online.coordination import Coordinator
from enkflow.online.data_plane import DataPlane
from enkflow.online.fields import Field, Ownership
from enkflow.online.probe import StatelessProbe
from enkflow.online.recovery import recover
from enkflow.online.scheduler import Scheduler, Task
from enkflow.online.segments import available
from enkflow.transport import Transport
from enkflow.online.server_config import ServerConfig
from enkflow.online.slots import SlotPool
from enkflow.online.sockets import Incarnation, bind, bind_collective, bus_host
from enkflow.online.store import MemoryStore
from enkflow.online.wire import credential
from enkflow.parallel import Comm, SerialComm, node_names
from enkflow.shm_names import remove_dead_segments, shm_dir

FLUSH_STEP = 1 << 21  # bytes of accepted forecasts copied between two looks at the sockets (~0.2 ms)

__all__ = ["ForecastObserver", "Problem", "Server", "ServerConfig"]


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


class ForecastObserver(Protocol):
    """Told on every rank when a cycle's forecast phase starts and when it has ended (benchmarks time it)."""

    def forecast_started(self, cycle: int) -> None: ...

    def forecast_ended(self, cycle: int) -> None: ...


class _Propagator:
    """The forecast phase as a :class:`~enkflow.experiment.cycling.Propagator`: serve runners until
    every member's forecast of the cycle is in (the first cycle may start with some recovered)."""

    def __init__(self, forecast: Callable[[int, set[int]], None], first: int | None, recovered: set[int]):
        self._forecast, self.first, self.recovered = forecast, first, recovered

    def forecast(self, cycle: int) -> None:
        self._forecast(cycle, self.recovered if cycle == self.first else set())


class Server:
    """One rank of the assimilation server; every rank of ``comm`` constructs one and calls :meth:`run`.

    ``events`` logs rank 0's events and every rank's refusals of data messages; ``progress``
    (rank 0) reports in words; ``observer`` is told when each forecast phase starts and ends.
    """

    def __init__(self, problem: Problem, config: ServerConfig, *, comm: Comm | None = None,
                 events: EventLog | None = None, progress: Callable[[str], None] | None = None,
                 observer: ForecastObserver | None = None):
        self.p = problem
        self.cfg = config
        self.comm = comm or SerialComm()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.events = events if self.rank == 0 else None
        self.progress = progress if self.rank == 0 else None
        self.observer = observer
        self.own = Ownership(tuple(problem.fields), self.size)
        # Ranks that own elements: a task is complete once each of them has its part.
        self.active = [r for r in range(self.size) if any(a < b for a, b in self.own.table()[r])]
        # One incarnation number for all ranks: data messages must carry the one the runner was welcomed with.
        self.me = Incarnation(credential(config.token),
                              self.comm.bcast(int.from_bytes(np.random.default_rng().bytes(7), "little") or 1, root=0))
        self.ckpt = ckpt.Checkpointer(config.checkpoint_dir, self.rank, self.own.fields, self.size) if config.checkpoint_dir else None
        self.slots: SlotPool | None = None
        self.store = self._make_store()
        self.cycle = -1
        self.stats: dict[str, float] = {}
        self.diagnostics: dict[int, dict[str, float]] = {}
        self.probe = StatelessProbe(self.store, self._emit)
        self.bus: Bus | None = None
        try:
            self._open_sockets(events)
        except BaseException:
            self._close_segments()
            raise

    def _make_store(self) -> MemoryStore:
        """Collective: this rank's store, in a store segment unless ``transport`` is TCP or (AUTO) none
        can be made (an ``online_shm_unavailable`` event says why); SHM without one raises ConfigError."""
        remove_dead_segments()  # a killed server's segments (this one's predecessor)
        want = self.cfg.transport is not Transport.TCP
        reason = available() if want else None
        store = None
        if want and reason is None:
            nonce = secrets.token_bytes(16)
            try:
                store = MemoryStore(self.own, self.comm, self.p.n_members, checkpointer=self.ckpt,
                                    shm=(nonce, self.me.epoch))
                self.slots = SlotPool(self.own.fields, store.ranges, nonce, self.me.epoch)
            except OSError as exc:
                reason = f"cannot make a segment in {shm_dir()}: {exc.strerror or exc}"
        reasons = self.comm.allgather_obj(reason)
        failed = [f"server rank {r}: {why}" for r, why in enumerate(reasons) if why is not None]
        if failed and self.cfg.transport is Transport.SHM:
            if store is not None:
                store.close()
            raise ConfigError(f"shared memory was asked for but is unavailable: {'; '.join(failed)}",
                              key="online.transport")
        if failed:
            self._emit("online_shm_unavailable", reason="; ".join(failed))
        return store or MemoryStore(self.own, self.comm, self.p.n_members, checkpointer=self.ckpt)

    def _close_segments(self) -> None:
        self.store.close()
        if self.slots is not None:
            self.slots.close()

    # -- sockets ------------------------------------------------------------------------

    def _open_sockets(self, events: EventLog | None) -> None:
        """Collective: every rank's data socket, rank 0's control socket, the bus; the address file."""
        ctx: zmq.Context = zmq.Context.instance()
        self.nodes = node_names(self.comm)
        bus_at = bus_host(self.cfg.bind, self.nodes)  # first: a bind no node but one can serve is refused at once
        data = bind_collective(ctx, self.comm, self.nodes, self.cfg.bind, curve_secret_key=self.cfg.curve_secret_key)
        # Every rank logs what its data socket refuses.
        self.data = DataPlane(data, self.store, self.me, log=events, ckpt=self.ckpt, report=self._report,
                              state_for=self.probe.state_for, keep_alive=self._beat, slots=self.slots)
        mine = advertised(data.getsockopt_string(zmq.LAST_ENDPOINT))
        self.data_addresses = [str(a) for a in self.comm.allgather_obj(mine)]
        seg = self.store.segment
        shm = None if seg is None or self.slots is None else {"segment": str(seg.path), "nonce": self.slots.nonce.hex()}
        self.shm = self.comm.allgather_obj(shm)
        self.control: Control | None = None
        self.coordinator: Coordinator | None = None
        address = None
        if self.rank == 0:
            # Control messages are small; libzmq drops a peer that sends a larger one before it is buffered.
            sock = bind(ctx, zmq.ROUTER, self.cfg.bind, port=self.cfg.port, max_message=4 << 20,
                        curve_secret_key=self.cfg.curve_secret_key)
            address = advertised(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            welcome = {"epoch": self.me.epoch, "ranks": self.size, "data": self.data_addresses,
                       "heartbeat_s": self.cfg.heartbeat_s, "shm": self.shm}
            self.control = Control(sock, Scheduler(self.p.n_members, self.cfg.scheduler), self.cfg, self.me,
                                   fields=self.own.fields, welcome=welcome, nsteps=self.p.nsteps, emit=self._emit,
                                   say=self._say, on_requeue=self._dropped)
            self.coordinator = Coordinator(self.control, self.probe, self.active, self.p.n_members, send=self._send,
                                           emit=self._emit, say=self._say)
        self.runners = self.control.runners if self.control is not None else {}
        self.bus = Bus.open(ctx, self.comm, self.me.cred, self._emit,
                            BusSettings(bus_at, self.cfg.heartbeat_s, self.cfg.rank_timeout_s, self.cfg.curve_secret_key),
                            self.nodes)
        self.address = self.comm.bcast(address, root=0)
        self.comm.barrier()

    @property
    def port(self) -> int:
        """The control port bound (of :attr:`address`, ``tcp://HOST:PORT``)."""
        return int(self.address.rsplit(":", 1)[1])

    def close(self) -> None:
        # Time for the last replies (STOP, the ERROR that ended a study) to leave on a loaded machine;
        # a ROUTER drops what is queued for a peer that is gone, so this waits only for live, slow peers.
        try:
            self.data.socket.close(linger=3000)
            if self.control is not None:
                self.control.socket.close(linger=3000)
            if self.bus is not None:
                self.bus.close(3000)
            if self.ckpt is not None:
                self.ckpt.close()
        finally:
            self._close_segments()

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
            start = recover(cycles, self.store, self.cfg.checkpoint_dir, initial=self.p.initial, say=self._say)
            self._emit("online_start", cycles=start.cycles, members=self.p.n_members, ranks=self.size, address=self.address,
                       nodes=self.nodes,
                       resumed=start.cycles != list(cycles), recovered_forecasts=sorted(start.forecasts))
            # Only now: the load above answers no HELLO, and a runner gives up after its reconnect_s.
            if self.rank == 0 and self.cfg.address_file is not None:
                write_bytes_atomic(self.cfg.address_file, (self.address + "\n").encode())
            if self.cfg.stateless_check and start.cycles and start.cycles[0] == cycles[0] and not start.forecasts:
                self.probe.arm(1)
            first = start.cycles[0] if start.cycles else None
            run_cycles(start.cycles, _Propagator(self._forecast, first, start.forecasts), self._analysis)
            self._finish()
        except BaseException:
            if self.control is not None:
                self._say_stopping()
                self._stop(self.control)
            raise
        finally:
            self.close()
        return self.diagnostics

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
        """Serve runners until every member's forecast of cycle ``k`` is in (``done``: recovered)."""
        if self.observer is not None:
            self.observer.forecast_started(k)
        self.cycle = k
        # Every rank starts the phase's heartbeat clocks together: rank-local work after the analysis's
        # last collective (a slow rank's checkpoint copy) must not count as silence.
        self.comm.barrier()
        self.data.start_cycle(k)
        self.stats = {"transfer_s": 0.0}
        t0 = time.perf_counter()
        if self.control is not None and self.coordinator is not None:
            self._emit("cycle_start", cycle=k)
            probe = self.probe.take()
            self.control.start_cycle(k, done, probe)
            self._serve_rank0(self.control, self.coordinator)
            self.data.end_forecast()
            self.stats["forecast_s"] = time.perf_counter() - t0
            self._count_tasks(done, probe, self.control)
            for r in range(1, self.size):
                self._send(r, BusMessage(BusOp.END_FORECAST, cycle=k))
        elif self.bus is not None:
            self._serve_other(self.bus)
            self.data.end_forecast()
            self.stats["forecast_s"] = time.perf_counter() - t0
        self.stats["transfer_s"] = self.data.transfer_s
        if self.observer is not None:
            self.observer.forecast_ended(k)

    def _serve_rank0(self, control: Control, coordinator: Coordinator) -> None:
        """Rank 0: runners, forecasts and the ranks' reports until every member's forecast is in."""
        poller = zmq.Poller()
        for s in (control.socket, self.data.socket, self.bus.socket if self.bus is not None else None):
            if s is not None:
                poller.register(s, zmq.POLLIN)
        last_check = 0.0
        if self.bus is not None:
            self.bus.rearm()
        control.dispatch()
        while not control.sched.complete:
            ready = self._poll(poller, 200)
            if control.socket in ready:
                control.receive()
            if self.data.socket in ready:
                self.data.receive()
            if self.bus is not None:
                for msg in self.bus.pending():  # all of them: a backlog would look like silence
                    coordinator.on_report(msg)
            now = time.monotonic()
            if now - last_check > 0.2:
                last_check = now
                control.check_liveness(now)
                if self.bus is not None:
                    self._watch(self.bus, now)
            control.dispatch()

    def _poll(self, poller: zmq.Poller, timeout_ms: int) -> dict:
        """The sockets ready within ``timeout_ms``. While nothing is ready, the rank works in steps of
        FLUSH_STEP bytes (a request waits for one step at most): it copies the accepted forecasts into
        the store, then, while no slot is free, makes a spare one (both off the runners' path)."""
        slots = self.slots
        while self.data.accepted or (slots is not None and slots.wants_spare):
            ready = dict(poller.poll(0))
            if ready:
                return ready
            if self.data.accepted:
                self.data.flush(budget=FLUSH_STEP)
            elif slots is not None:
                slots.prepare(FLUSH_STEP)
        return dict(poller.poll(timeout_ms))

    def _count_tasks(self, done: set[int], probe: int | None, control: Control) -> None:
        """Rank 0's statistics of the cycle's tasks (``done``: the forecasts recovered; ``probe``: the
        member run twice)."""
        sched = control.sched
        needed = self.p.n_members - len(done) + (1 if probe is not None else 0)  # the tasks without reruns
        self.stats.update(runner_idle_s=control.idle_s, tasks=float(sched.assigned),
                          recomputed=float(sched.assigned - needed), recovered=float(len(done)),
                          runners=float(len(self.runners)))
        for cause, n in sched.redone.items():
            self.stats[f"redone_{cause}"] = float(n)

    def _serve_other(self, bus: Bus) -> None:
        """A rank other than 0: receive forecasts and rank 0's orders until the forecast phase ends."""
        poller = zmq.Poller()
        poller.register(self.data.socket, zmq.POLLIN)
        poller.register(bus.socket, zmq.POLLIN)
        bus.rearm()
        while True:
            ready = self._poll(poller, int(1000 * bus.beat_s))
            if self.data.socket in ready:
                self.data.receive()
            for msg in bus.pending():  # before judging silence: what is queued was heard
                if msg.op is BusOp.END_FORECAST and msg.cycle == self.cycle:
                    return
                if msg.op is BusOp.STOP:
                    raise EnkflowError(msg.reason or "the server stopped")
                self._on_order(msg)
            self._watch(bus, time.monotonic())

    # -- the bus: reports to rank 0, its orders to every rank -----------------------------

    def _watch(self, bus: Bus, now: float) -> None:
        """Heartbeats to the peers; a peer silent too long stops this rank (:class:`RankLost`)."""
        bus.beat(now)
        lost = bus.silent(now)
        if lost:
            who = ", ".join(f"rank {r} (node {self.nodes[r]})" for r in lost)
            self._emit("server_rank_lost", cycle=self.cycle, ranks=lost, nodes=[self.nodes[r] for r in lost])
            raise RankLost(f"server rank {self.rank}: {who} silent on the bus for {bus.timeout_s:g} s ([online] "
                           "rank_timeout); the server stops, to be restarted from its checkpoints",
                           ranks=lost, nodes=[self.nodes[r] for r in lost])

    def _beat(self) -> None:
        """Heartbeats while this rank waits (for its analysis checkpoint) inside a forecast phase."""
        if self.bus is not None:
            self.bus.beat(time.monotonic())

    def _send(self, rank: int, msg: BusMessage) -> None:
        """``msg`` to rank ``rank``; one to this rank itself (rank 0) is handled at once."""
        if rank != self.rank:
            if self.bus is not None:
                self.bus.send(rank, msg)
        elif self.coordinator is not None and msg.op.is_report:
            self.coordinator.on_report(msg)
        else:
            self._on_order(msg)

    def _report(self, msg: BusMessage) -> None:
        self._send(0, msg)

    def _on_order(self, msg: BusMessage) -> None:
        """Rank 0's order about a task's staged frames: take them, drop them, or compare them."""
        if msg.op is BusOp.ACCEPT:
            self.data.accept(msg.task, msg.member, msg.cycle)
        elif msg.op is BusOp.DROP:
            self.data.unstage(msg.task)
        elif msg.op is BusOp.COMPARE:
            self.data.flush(msg.member)  # the first run's forecast, compared with this one
            diff = self.probe.compare(self.data.unstage(msg.task), msg.member)
            self._report(BusMessage(BusOp.DIFFER if diff else BusOp.SAME, msg.task, msg.member, msg.cycle,
                                    reason=diff or ""))

    def _dropped(self, t: Task) -> None:
        """Every rank forgets what it staged for a task taken back from its runner (rank 0's requeue)."""
        assert self.coordinator is not None  # made right after the Control that calls this
        self.coordinator.drop(t)

    # -- the end ---------------------------------------------------------------------------

    def _say_stopping(self) -> None:
        """The stop file, before any runner is told to stop, at the end or on a failure: a supervisor
        must not take a runner that leaves when told for one that failed, nor replace it."""
        if self.cfg.stop_file is None:
            return
        try:
            write_json_atomic(self.cfg.stop_file, {"cycles": sorted(self.diagnostics)})
        except OSError as exc:  # not in place of the error that ends the study: only runners replaced needlessly
            self._say(f"cannot write {self.cfg.stop_file}: {exc}")

    def _stop(self, control: Control) -> None:
        """Tell waiting runners the study is over; the other ranks stop too."""
        control.stop_waiting()
        if self.bus is not None:
            self.bus.stop_ranks("the server stopped")

    def _finish(self, grace_s: float = 1.0) -> None:
        """After the last cycle: STOP to every runner that asks for work during a short grace period."""
        self.comm.barrier()
        if self.control is None:
            return
        self._say_stopping()
        told = self.control.waiting_runners()
        self._stop(self.control)
        self.control.stop_latecomers(told, grace_s)
        self._emit("experiment_end", cycles=sorted(self.diagnostics))
