"""Rank 0's control socket: runners join, ask for work, fail, leave; members are scheduled onto them.

A runner greets with HELLO (its fields must be the server's) and gets the
WELCOME (the data sockets' addresses, the incarnation, the heartbeat period).
READY asks for a task; the reply, TASK, is deferred until a member is pending
(:meth:`Control.dispatch`). FAIL gives the task back as a failure of the
member, BYE leaves. A runner that sends no heartbeat for
``heartbeat_timeout_s`` is dropped, and a task past its due date goes back to
the queue (:meth:`Control.check_liveness`); a requeued member is handed out
again with a new task id (:class:`~enkflow.online.scheduler.Scheduler`).
"""

from __future__ import annotations

import hmac
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from enkflow.errors import EnkflowError, MemberError
from enkflow.online.fields import Field, describe_mismatch
from enkflow.online.scheduler import Scheduler, Task
from enkflow.online.server_config import ServerConfig
from enkflow.online.sockets import Incarnation, send_error
from enkflow.online.wire import Header, Kind, ProtocolError, decode_json, encode_json


# Why a runner's fields are refused is nearly always the configuration, not the model: say where they come from.
FIELDS_HINT = ("the server's fields are the state variables ([state] variables), then the restart variables the model "
               "needs back but the analysis leaves alone ([online] carried): declare each variable of the runner in one "
               "of them, or drop it from the runner")


@dataclass
class RunnerRecord:
    """A runner that joined; times in seconds of ``time.monotonic``."""

    id: int
    identity: bytes  # of its control connection: where replies go
    name: str
    last_seen: float
    waiting_since: float | None = None  # its READY, while it has no TASK yet


class Control:
    """Rank 0's runner registry and scheduling over the control socket.

    ``welcome``: the WELCOME's body; ``nsteps(cycle)`` the model steps of a task;
    ``emit``/``say`` the event log and progress; ``on_requeue(task)`` is called for a
    task taken back from its runner (the ranks must drop what they staged for it).
    """

    def __init__(self, sock: zmq.Socket, sched: Scheduler, cfg: ServerConfig, me: Incarnation, *,
                 fields: tuple[Field, ...], welcome: dict[str, object], nsteps: Callable[[int], int],
                 emit: Callable[..., None], say: Callable[[str], None], on_requeue: Callable[[Task], None]):
        self.socket, self.sched, self.cfg, self.me = sock, sched, cfg, me
        self._fields, self._welcome, self._nsteps = fields, welcome, nsteps
        self._emit, self._say, self._on_requeue = emit, say, on_requeue
        self.runners: dict[int, RunnerRecord] = {}
        self.waiting: deque[int] = deque()  # runners waiting for a task, in the order they asked
        self._dispatched = False  # min_runners was reached once
        self.idle_s = 0.0  # runners' waits for a task reported this cycle, seconds

    def start_cycle(self, cycle: int, done: set[int], probe: int | None) -> None:
        """A new cycle: every member not in ``done`` (recovered) is pending, ``probe`` twice."""
        self.sched.start_cycle(cycle, done, probe=probe)
        self.idle_s = 0.0

    def reply(self, identity: bytes, hdr: Header, *frames: bytes) -> None:
        self.socket.send_multipart([identity, hdr.pack(), *frames], copy=False)

    def receive(self, most: int = 256) -> None:
        """Handle the queued control messages, at most ``most`` of them."""
        for _ in range(most):
            try:
                self._on_message(self.socket.recv_multipart(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                break

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        hdr = self._admitted(identity, frames)
        if hdr is None:
            return
        now = time.monotonic()
        r = self.runners.get(hdr.runner)
        if hdr.kind is Kind.HELLO:
            self._hello(identity, hdr, frames[2:], now)
            return
        if r is None:
            if hdr.kind in (Kind.READY, Kind.FAIL):
                send_error(self.socket, identity, hdr, "unknown runner (it was declared lost or the server restarted): "
                                                       "greet the server again (HELLO)", self.me)
            return
        r.last_seen = now
        if hdr.kind is Kind.HEARTBEAT:
            return
        if hdr.kind is Kind.READY:
            self._ready(r, identity, hdr, now)
        elif hdr.kind is Kind.FAIL:
            self._fail(r, identity, hdr, frames)
        elif hdr.kind is Kind.BYE:
            self._drop_runner(r, "left", None)
        else:
            send_error(self.socket, identity, hdr, f"unexpected {hdr.kind.name} on the control socket", self.me)

    def _admitted(self, identity: bytes, frames: list[zmq.Frame]) -> Header | None:
        """The message's header if it is readable and carries the credential, else None (refused;
        a heartbeat with a wrong token silently)."""
        try:
            hdr = Header.unpack(frames[1].buffer) if len(frames) > 1 else Header.unpack(b"")
        except ProtocolError as exc:
            self._emit("online_reject", reason=str(exc))
            send_error(self.socket, identity, None, str(exc), self.me)
            return None
        if not hmac.compare_digest(hdr.credential, self.me.cred):
            if hdr.kind is not Kind.HEARTBEAT:
                self._emit("online_reject", reason="wrong token", runner=hdr.runner, id=hdr.runner)
                send_error(self.socket, identity, hdr, "authentication failed: wrong token", self.me)
            return None
        return hdr

    def _hello(self, identity: bytes, hdr: Header, frames: list[zmq.Frame], now: float) -> None:
        try:
            body = decode_json(frames[0].buffer, "hello") if frames else {}
            if not isinstance(body.get("fields", []), list):
                raise ProtocolError(f"'fields' is {type(body['fields']).__name__}, not a list")
            got = [Field.from_json(d) for d in body.get("fields", [])]
            ranks = int(body.get("ranks", 1))
        except (EnkflowError, TypeError, ValueError) as exc:
            self._emit("online_reject", reason=f"bad HELLO: {exc}", runner=hdr.runner, id=hdr.runner)
            send_error(self.socket, identity, hdr, f"bad HELLO: {exc}", self.me)
            return
        diff = describe_mismatch(list(self._fields), got)
        name = str(body.get("name", hdr.runner))[:200]
        if diff:
            self._emit("online_reject", runner=name, id=hdr.runner, reason=diff)
            send_error(self.socket, identity, hdr, f"the runner's fields do not match the server's: {diff}; {FIELDS_HINT}",
                       self.me)
            return
        old = self.runners.get(hdr.runner)
        if old is not None:
            self._drop_runner(old, "rejoined", None)
        self.runners[hdr.runner] = RunnerRecord(hdr.runner, identity, name, now)
        self._emit("runner_join", runner=name, id=hdr.runner, ranks=ranks)
        self.reply(identity, hdr.reply(Kind.WELCOME, epoch=self.me.epoch), encode_json(self._welcome))

    def _ready(self, r: RunnerRecord, identity: bytes, hdr: Header, now: float) -> None:
        r.identity = identity
        if 0 <= hdr.nsteps < 10**13:  # the runner's wait for its previous task, microseconds
            self.idle_s += hdr.nsteps / 1e6
        if r.waiting_since is None:
            r.waiting_since = now
            self.waiting.append(r.id)

    def _fail(self, r: RunnerRecord, identity: bytes, hdr: Header, frames: list[zmq.Frame]) -> None:
        try:
            msg = decode_json(frames[2].buffer, "fail").get("error", "?") if len(frames) > 2 else "?"
        except ProtocolError as exc:
            self._emit("online_reject", reason=f"bad FAIL: {exc}", runner=r.name)
            send_error(self.socket, identity, hdr, f"bad FAIL: {exc}", self.me)
            return
        t = self.sched.current(hdr.task, hdr.cycle)
        if t is not None and t.runner == r.id:
            self.requeue(t.id, "failed", f"runner {r.name}: {msg}")

    def dispatch(self) -> None:
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
            self.reply(r.identity, Header(Kind.TASK, self.me.cred, r.id, t.id, t.member, t.cycle, self._nsteps(t.cycle),
                                          epoch=self.me.epoch))
            self._emit("task_assign", cycle=t.cycle, member=t.member, task=t.id, runner=r.name)

    def check_liveness(self, now: float) -> None:
        """Drop the runners that sent no heartbeat for too long; requeue the tasks past their due date."""
        for r in list(self.runners.values()):
            if now - r.last_seen > self.cfg.heartbeat_timeout_s:
                self._drop_runner(r, "lost", f"runner {r.name} sent no heartbeat for {now - r.last_seen:.1f} s "
                                             "(killed, hung or cut off)")
        for t in self.sched.overdue(now):
            held = self.runners.get(t.runner)
            self.requeue(t.id, "late", f"runner {held.name if held else t.runner} did not finish by the due date "
                                       f"({t.due - t.t_start:.1f} s after it started)")

    def _drop_runner(self, r: RunnerRecord, why: str, error: str | None) -> None:
        self.runners.pop(r.id, None)
        self._emit("runner_" + ("lost" if error else "leave"), runner=r.name, id=r.id, reason=why)
        for t in self.sched.held_by(r.id):
            self.requeue(t.id, why, error)

    def requeue(self, task_id: int, cause: str, error: str | None) -> None:
        """The task's member back to the front of the queue (``error``: as a failure of the member)."""
        held = self.sched.tasks.get(task_id)
        try:
            t = self.sched.requeue(task_id, cause, error)
        except MemberError as exc:  # ``id``: the runner whose failure was the last straw, whose log a supervisor shows
            self._emit("experiment_fail", cycle=self.sched.cycle, member=exc.member, id=held.runner if held else None,
                       report={"reason": str(exc)})
            raise
        if t is not None:
            self._emit("task_requeue", cycle=t.cycle, member=t.member, task=t.id, reason=cause, error=error)
            self._say(f"cycle {t.cycle}: member {t.member} rescheduled ({cause})")
            self._on_requeue(t)

    # -- the end --------------------------------------------------------------------------

    def waiting_runners(self) -> set[int]:
        """The ids of the runners waiting for a task."""
        return {rid for rid in self.waiting if rid in self.runners and self.runners[rid].waiting_since is not None}

    def stop_waiting(self) -> None:
        """STOP to every runner waiting for a task: the study is over."""
        for rid in list(self.waiting):
            r = self.runners.get(rid)
            if r is not None and r.waiting_since is not None:
                self.reply(r.identity, Header(Kind.STOP, self.me.cred, r.id, epoch=self.me.epoch))
        self.waiting.clear()

    def stop_latecomers(self, told: set[int], grace_s: float) -> None:
        """STOP to every runner that asks for work within ``grace_s`` seconds; ``told``: the runners told already."""
        # The whole grace period, not just until 100 ms pass without a message (a runner whose last ACK
        # came late asks later); it ends early, after 100 ms of quiet for the replies to leave, once
        # every runner that joined has been told.
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.socket.poll(100):
                if self.runners.keys() <= told:
                    break
                continue
            frames = self.socket.recv_multipart(copy=False)
            try:
                hdr = Header.unpack(frames[1].buffer)
            except (ProtocolError, IndexError):
                continue
            if not hmac.compare_digest(hdr.credential, self.me.cred):
                continue
            if hdr.kind is Kind.READY:
                self.reply(frames[0].bytes, Header(Kind.STOP, self.me.cred, hdr.runner, epoch=self.me.epoch))
                told.add(hdr.runner)
            elif hdr.kind is Kind.BYE:
                told.add(hdr.runner)
