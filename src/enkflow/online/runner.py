"""The Python runner API: a model exchanges its member states with the server in memory.

::

    with Runner("tcp://127.0.0.1:5555", token) as runner:
        runner.init([Field("x", "float64", (40,))])
        state = {"x": np.zeros(40)}
        state, nsteps = runner.expose(state)        # the first state to propagate
        while nsteps:
            advance(state["x"], nsteps, runner.cycle, runner.member)
            state, nsteps = runner.expose(state)    # send the forecast back, get the next member

``expose`` sends the forecast of the task it holds (none on the first call),
asks for the next task and fills ``state`` in place with that member's state;
``nsteps == 0`` means the study is over. Leaving the ``with`` block says BYE (an exception FAILs the
member held first); a runner left open is closed the same way when its process ends
(:mod:`enkflow.online.exit_report`). The server may hand any member to any
runner, so the model must keep no member's state of its own between calls
(the server's ``stateless_check`` tests that in the first cycle).

An MPI model passes ``comm`` (an :class:`enkflow.parallel.Comm`) and, per
field, this rank's slice of the flattened field (``slices={name: (offset,
count)}``, 64-bit element counts); each rank then sends its slice straight to
the server ranks owning those elements (N-to-M), and only rank 0 talks to the
scheduler. A server that goes away and comes back (restarted from its
checkpoint) is greeted again transparently; the task in hand is then dropped.

With a server rank on its node, a runner copies states once each way between the model's
arrays and the server's shared memory (:mod:`enkflow.online.shm_exchange`; ``transport``);
the netCDF interception, whose model copies itself, calls :meth:`Runner.expose_in_place`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from enum import Enum

import numpy as np
import zmq

from enkflow.errors import EnkflowError, InputError
from enkflow.jobs.lease import watch_from_environment
from enkflow.online import exit_report
from enkflow.online.connection import Connection, ServerError, ServerLost
from enkflow.online.contact import note_contact
from enkflow.online.fields import Field, Ownership
from enkflow.online.heartbeat import Heartbeat
from enkflow.online.segments import SLOT_GONE
from enkflow.transport import Transport
from enkflow.online.shm_exchange import Extent, ShmExchange, choose_ranks
from enkflow.online.wire import (NO_SLOT, Header, Kind, credential, decode_index, decode_json, encode_finite, encode_index,
                                encode_json)
from enkflow.parallel import Comm, SerialComm
from enkflow.shm_names import remove_dead_segments

State = Mapping[str, np.ndarray] | np.ndarray
__all__ = ["Exchange", "Extent", "Runner", "State", "run_runner_process"]


class Exchange(Enum):
    """The steps of :meth:`Runner.expose`, as a runner's ``on_exchange`` hook is told them."""

    PUT = "put"  # the forecast sent to the server ranks, each acknowledged
    READY = "ready"  # READY sent, until the TASK (or STOP) came
    GET = "get"  # the next member's state received from the server ranks


class Runner:
    """One model instance (all ranks of an MPI model) serving the members the server hands it.

    ``timeout_s`` bounds every wait for the server except the wait for a task;
    ``reconnect_s`` is how long a runner waits for a lost server to come back.
    ``on_exchange(step, seconds)`` is told the wall seconds of each step of :meth:`expose`
    that completed (benchmarks time the exchange with it). ``transport``: shared memory with the
    server ranks on this node where possible (AUTO), required (SHM) or never (TCP); None: the
    environment's ``ENKFLOW_TRANSPORT``, else AUTO.
    """

    def __init__(self, address: str, token: str, *, comm: Comm | None = None, name: str | None = None,
                 curve_server_key: str | None = None, timeout_s: float = 600.0, reconnect_s: float = 120.0,
                 on_exchange: Callable[[Exchange, float], None] | None = None, transport: Transport | None = None):
        self.address = address
        self.transport = transport or Transport.from_environment()
        self._shm = ShmExchange()
        self.comm = comm or SerialComm()
        self.name = name or f"{os.uname().nodename}:{os.getpid()}"
        self._cred = credential(token)
        self._curve = curve_server_key
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        self.on_exchange = on_exchange
        self.id = self.comm.bcast(uuid.uuid4().int & ((1 << 63) - 1) or 1, root=0)
        self._ctx = zmq.Context.instance()
        self._control: Connection | None = None
        self._data: list[Connection] = []
        self._fields: list[Field] = []
        self._slices: list[tuple[int, int]] = []
        self._own: Ownership | None = None
        self._epoch = 0
        self._hb: Heartbeat | None = None
        self._waited_us = 0
        self._have_state = False
        self._finite: frozenset[int] = frozenset()  # in place: the fields the next PUT_SLOT vouches finite
        self.task = 0
        self.member = 0
        self.cycle = 0
        self.nsteps = 0
        # Started by `enkflow run`: stop once its lease lapses, whether the model uses this class alone
        # or run_runner_process; and remove the shared-memory names of processes killed on this node
        # (here and at the end: no other process of the study may come to this node after it).
        self._leased = watch_from_environment(f"runner {self.name}")
        if self._leased:
            remove_dead_segments()
        exit_report.register(self)  # a process that ends with this runner open still tells the server why

    # -- set-up ------------------------------------------------------------------

    def init(self, fields: Sequence[Field | dict], slices: Mapping[str, tuple[int, int]] | None = None) -> None:
        """Declare the fields of a member's state (and this rank's slice of each) and join the server.

        A server that expects other fields, sizes or dtypes refuses with a :class:`ServerError` naming them.
        """
        self._fields = [f if isinstance(f, Field) else Field.from_json(dict(f)) for f in fields]
        if not self._fields:
            raise InputError("a runner needs at least one field", item="fields")
        names = [f.name for f in self._fields]
        if len(set(names)) != len(names):
            raise InputError(f"duplicate field names in {names}", item="fields")
        slices = dict(slices or {})
        unknown = set(slices) - set(names)
        if unknown:
            raise InputError(f"slices for unknown fields {sorted(unknown)}", item="slices")
        self._slices = []
        for f in self._fields:
            off, cnt = (int(v) for v in slices.get(f.name, (0, f.size)))
            if off < 0 or cnt < 0 or off + cnt > f.size:
                raise InputError(f"field {f.name!r}: slice ({off}, {cnt}) outside its {f.size} elements", item="slices")
            self._slices.append((off, cnt))
        self._join()

    def _join(self) -> None:
        """HELLO from rank 0; every rank connects to the data sockets named in the WELCOME and maps
        the segments of the server ranks on its node (a killed server's names removed first)."""
        self._shm.close()  # first: their pinned pages would leave a restarted server less room in /dev/shm
        remove_dead_segments()
        welcome = self._from_rank0(self._hello)
        for c in self._data:
            c.close()
        self._epoch = int(welcome["epoch"])
        self._own = Ownership(tuple(self._fields), int(welcome["ranks"]))
        self._data = [Connection(self._ctx, a, curve_server_key=self._curve) for a in welcome["data"]]
        self._collective(lambda: self._shm.reset(choose_ranks(welcome, self.transport)))
        if self.comm.rank == 0 and self._hb is None:
            self._hb = Heartbeat(self._ctx, self.address, self._cred, self.id, float(welcome["heartbeat_s"]), self._curve)

    def _hello(self) -> dict:
        if not self._epoch:  # its first greeting: a supervisor tells a failed start from a server not answering
            note_contact(self.id)
        deadline = time.monotonic() + self.reconnect_s
        while True:
            if self._control is None:
                self._control = Connection(self._ctx, self.address, curve_server_key=self._curve)
            hdr = Header(Kind.HELLO, self._cred, self.id)
            body = {"name": self.name, "fields": [f.as_json() for f in self._fields], "ranks": self.comm.size}
            self._control.send([hdr.pack(), encode_json(body)])
            try:
                _, frames = self._control.recv(max(1.0, deadline - time.monotonic()), lambda h: h.kind is Kind.WELCOME)
                return decode_json(frames[0].buffer, "welcome")
            except ServerLost:
                self._control.close()
                self._control = None
                if time.monotonic() > deadline:
                    raise ServerLost(f"no enkflow server answered at {self.address} within {self.reconnect_s:g} s") from None
                time.sleep(0.2)

    # -- the exchange ---------------------------------------------------------------

    def expose(self, state: State) -> tuple[State, int]:
        """Send the forecast in ``state`` (of the task held), fill ``state`` with the next member's
        state in place and return it with the number of steps to run (0: stop).

        ``state``: a dict of this rank's slice of every field (1-D views are fine; any
        C-contiguous array of the field's dtype and slice size), or one array when the
        runner has a single field.
        """
        _, nsteps = self._exchange(self._arrays(state))
        return state, nsteps

    @property
    def in_place(self) -> bool:
        """Whether every piece of every field of this rank goes through shared memory (after :meth:`init`)."""
        routes = self._routes() if self._own is not None else {}
        return bool(routes) and all(self._shm.over_shm(r) for r in routes)

    def expose_in_place(self, finite: Collection[int] = ()) -> tuple[list[Extent], int]:
        """:meth:`expose` for a runner whose forecast another process (the model under the netCDF
        interception) wrote into the held task's slot, and which reads the next member's state from the
        segments itself: PUT_SLOT of the held task (if its state was fetched), READY/TASK, GET_SLOT of the
        next task; returns the new task's extents (where its state is, where its forecast goes) and its
        number of steps (0: stop, no extents). ``finite``: the indices of the fields whose every element
        in the slot the writer found finite as it wrote it (the server then does not read them again).
        Raises EnkflowError unless :attr:`in_place`."""
        self._check_in_place()
        return self._exchange(None, frozenset(finite))

    def _check_in_place(self) -> None:
        if not self.in_place:
            raise EnkflowError(f"runner {self.name}: expose_in_place needs every piece of its fields in shared memory "
                               f"(transport {self.transport.value}; a server rank on another node, or one without "
                               "shared memory, is reached over TCP): use expose")

    def _exchange(self, arrays: list[np.ndarray] | None, finite: frozenset[int] = frozenset()) -> tuple[list[Extent], int]:
        """PUT of the held task's forecast, READY/TASK, GET of the next (``arrays`` None: in place, no
        copies, and ``finite`` the fields found finite in the slot); the new task's shared-memory extents
        and its steps."""
        if self.task and self._have_state:
            t0 = time.perf_counter()
            self._finite = finite
            self._put(arrays)
            self._exchanged(Exchange.PUT, t0)
        elif self.task:
            # The GET of this task did not complete (an error or an interruption the model caught): the
            # arrays hold no forecast of this member. Give the task back instead of sending them.
            self.fail("the member's state never arrived (its GET was interrupted); nothing was forecast")
        while True:
            try:
                t0 = time.perf_counter()
                hdr = self._next_task()
                self._exchanged(Exchange.READY, t0)
                if hdr.kind is Kind.STOP:
                    self._set_task(0, 0, hdr.cycle, 0)
                    return [], 0
                self._set_task(hdr.task, hdr.member, hdr.cycle, hdr.nsteps)
                t0 = time.perf_counter()
                extents = self._get(arrays)
                self._exchanged(Exchange.GET, t0)
                self._have_state = True
                return extents, self.nsteps
            except ServerLost:
                self._set_task(0, 0, 0, 0)
                self._join()
                if arrays is None:  # a restarted server (on another node?) may no longer be in reach of memory
                    self._check_in_place()
            except ServerError as exc:
                if SLOT_GONE not in str(exc):
                    raise
                # The server retired the task's slot between its SLOT reply and this runner's mapping of it
                # (the task went stale, or the server is stopping): forgotten, as a stale PUT is; ask again.
                self._set_task(0, 0, 0, 0)

    def fail(self, error: str) -> None:
        """Report that the model failed on the member it holds (the server gives it to another runner)."""
        if self.comm.rank == 0 and self.task and self._control is not None:
            hdr = Header(Kind.FAIL, self._cred, self.id, self.task, self.member, self.cycle, epoch=self._epoch)
            self._control.send([hdr.pack(), encode_json({"error": str(error)[-4000:]})])
        self._set_task(0, 0, 0, 0)

    def close(self) -> None:
        """Leave the study (BYE; a task still held goes to another runner)."""
        exit_report.forget(self)
        if self._hb is not None:
            self._hb.stop()
            self._hb = None
        if self.comm.rank == 0 and self._control is not None:
            self._control.send([Header(Kind.BYE, self._cred, self.id, self.task, epoch=self._epoch).pack()])
            time.sleep(0.05)  # let the I/O thread flush the BYE before the socket goes
        for c in self._data:
            c.close()
        self._data = []
        self._shm.close()
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._leased:
            remove_dead_segments()

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.task:
            self.fail(f"{exc_type.__name__}: {exc}")
        self.close()

    # -- internals ------------------------------------------------------------------

    def _exchanged(self, step: Exchange, t0: float) -> None:
        """Tell ``on_exchange`` the seconds since ``t0`` (``time.perf_counter``) that ``step`` took."""
        if self.on_exchange is not None:
            self.on_exchange(step, time.perf_counter() - t0)

    def _set_task(self, task: int, member: int, cycle: int, nsteps: int) -> None:
        self.task, self.member, self.cycle, self.nsteps = task, member, cycle, nsteps
        self._have_state = False  # set once the task's GET completed
        if self._hb is not None:
            self._hb.task = task

    def _arrays(self, state: State) -> list[np.ndarray]:
        if isinstance(state, np.ndarray):
            if len(self._fields) != 1:
                raise InputError(f"expose got one array, but the runner declared {len(self._fields)} fields; pass a dict",
                                 item="state")
            state = {self._fields[0].name: state}
        out = []
        for f, (_, cnt) in zip(self._fields, self._slices):
            if f.name not in state:
                raise InputError(f"expose: field {f.name!r} missing from the state", item=f.name)
            a = state[f.name]
            if not isinstance(a, np.ndarray) or a.dtype != np.dtype(f.dtype) or a.size != cnt or not a.flags.c_contiguous:
                raise InputError(f"expose: field {f.name!r} must be a C-contiguous {f.dtype} array of {cnt} elements, "
                                 f"got {getattr(a, 'dtype', type(a))} of {getattr(a, 'size', '?')}", item=f.name)
            out.append(a.reshape(-1))
        return out

    def _routes(self) -> dict[int, list[tuple[int, int, int]]]:
        """Per server rank, the pieces (field, offset, count) of this rank's slices it owns."""
        assert self._own is not None
        routes: dict[int, list[tuple[int, int, int]]] = {}
        for k, (off, cnt) in enumerate(self._slices):
            for r, a, b in self._own.pieces(k, off, off + cnt):
                routes.setdefault(r, []).append((k, a, b - a))
        return routes

    def _collective(self, fn) -> None:
        """Run ``fn`` on every rank; a lost server or an error on any rank reaches them all."""
        status: tuple[str, str] = ("ok", "")
        try:
            fn()
        except ServerLost as exc:
            status = ("lost", str(exc))
        except EnkflowError as exc:
            status = ("err", str(exc))
        every = self.comm.allgather_obj(status)
        for kind in ("err", "lost"):
            for s, msg in every:
                if s == kind:
                    raise (ServerError if kind == "err" else ServerLost)(msg)

    def _put(self, arrays: list[np.ndarray] | None) -> None:
        """The held task's forecast to the server ranks (``arrays`` None: already in its slots, and
        ``self._finite`` the fields found finite there)."""
        task, member, cycle, finite = self.task, self.member, self.cycle, self._finite
        self._finite = frozenset()
        starts = [off for off, _ in self._slices]

        def put() -> None:
            sent = []
            for r, pieces in self._routes().items():
                idx = np.array(pieces, dtype=np.int64).reshape(-1, 3)
                kind = Kind.PUT_SLOT if self._shm.over_shm(r) else Kind.PUT
                frames: list[object] = [Header(kind, self._cred, self.id, task, member, cycle, count=len(pieces),
                                               epoch=self._epoch).pack(), encode_index(idx)]
                if kind is Kind.PUT_SLOT and arrays is not None:
                    self._shm.write(self._shm.extents[r], arrays, starts)
                elif kind is Kind.PUT_SLOT and finite:
                    frames.append(encode_finite([k in finite for k, _, _ in pieces]))
                elif arrays is not None:
                    frames.extend(arrays[k][off - starts[k]:off - starts[k] + cnt] for k, off, cnt in pieces)
                self._data[r].send(frames)
                sent.append(r)
            for r in sent:
                self._data[r].recv(self.timeout_s, lambda h: h.kind is Kind.ACK and h.task == task, epoch=self._epoch,
                                   task=task)

        try:
            self._collective(put)
        except ServerLost:
            self._set_task(0, 0, 0, 0)
            self._join()
        except ServerError as exc:
            self._set_task(0, 0, 0, 0)
            if NO_SLOT in str(exc) or SLOT_GONE in str(exc):
                return  # a stale task (this runner was declared lost): forgotten, as a late PUT's ACK says
            raise ServerError(f"the server rejected the forecast of member {member}, cycle {cycle}: {exc}") from None
        self._set_task(0, 0, 0, 0)

    def _next_task(self) -> Header:
        return self._from_rank0(self._ready)

    def _from_rank0(self, fn):
        """``fn()`` on rank 0 (the one that talks to the control socket), its result on every rank;
        a lost server or an error raises the same on every rank."""
        result: tuple[str, object] = ("ok", None)
        if self.comm.rank == 0:
            try:
                result = ("ok", fn())
            except ServerLost as exc:
                result = ("lost", str(exc))
            except EnkflowError as exc:
                result = ("err", str(exc))
        result = self.comm.bcast(result, root=0)
        if result[0] == "lost":
            raise ServerLost(str(result[1]))
        if result[0] == "err":
            raise ServerError(str(result[1]))
        return result[1]

    def _ready(self) -> Header:
        if self._control is None:  # an earlier attempt to greet the server gave up: expose tries again
            raise ServerLost(f"not connected to the server at {self.address}")
        while True:
            # READY carries (in nsteps) how long this runner waited for its previous task, in microseconds:
            # only the runner knows it, since READYs queue unread while the server runs the analysis.
            self._control.send([Header(Kind.READY, self._cred, self.id, nsteps=self._waited_us, epoch=self._epoch).pack()])
            t0 = time.monotonic()
            try:
                # Waiting for a task may take as long as the other members' forecasts and the analysis.
                hdr, _ = self._control.recv(10 * 24 * 3600.0, lambda h: h.kind in (Kind.TASK, Kind.STOP))
                self._waited_us = int((time.monotonic() - t0) * 1e6)
                return hdr
            except ServerError as exc:
                if "unknown runner" not in str(exc):
                    raise
                # The server declared this runner gone (it was late or stopped): greet it again.
                raise ServerLost(str(exc)) from None

    def _get(self, arrays: list[np.ndarray] | None) -> list[Extent]:
        """The held task's state from the server ranks into ``arrays`` (None: in place, no copy); its
        shared-memory extents."""
        task, member, cycle = self.task, self.member, self.cycle
        starts = [off for off, _ in self._slices]
        extents: list[Extent] = []

        def get() -> None:
            routes = self._routes()
            for r, pieces in routes.items():
                kind = Kind.GET_SLOT if self._shm.over_shm(r) else Kind.GET
                idx = np.array(pieces, dtype=np.int64).reshape(-1, 3)
                self._data[r].send([Header(kind, self._cred, self.id, task, member, cycle, count=len(pieces),
                                           epoch=self._epoch).pack(), encode_index(idx)])
            for r, pieces in routes.items():
                want = Kind.SLOT if self._shm.over_shm(r) else Kind.DATA
                hdr, frames = self._data[r].recv(self.timeout_s, lambda h: h.kind is want and h.task == task,
                                                 epoch=self._epoch, task=task)
                if want is Kind.SLOT:
                    got = self._shm.answer(r, pieces, hdr, frames)
                    if arrays is not None:
                        self._shm.read(got, arrays, starts)
                    extents.extend(got)
                elif arrays is not None:
                    self._copy_data(r, pieces, hdr, frames, arrays, starts)

        self._collective(get)
        return extents

    def _copy_data(self, r: int, pieces: list[tuple[int, int, int]], hdr: Header, frames: list[zmq.Frame],
                   arrays: list[np.ndarray], starts: list[int]) -> None:
        """Server rank ``r``'s DATA reply to a GET of ``pieces``, copied into ``arrays``."""
        idx = decode_index(frames[0].buffer, hdr.count)
        if hdr.count != len(pieces) or len(frames) != 1 + hdr.count or not np.array_equal(idx, np.array(pieces).reshape(-1, 3)):
            raise ServerError(f"server rank {r} answered with other pieces than asked for")
        for (k, off, cnt), fr in zip(pieces, frames[1:]):
            dst = arrays[k][off - starts[k]:off - starts[k] + cnt]
            src = np.frombuffer(fr.buffer, dtype=dst.dtype)
            if src.size != cnt:
                raise ServerError(f"server rank {r} sent {src.size} elements of field "
                                  f"{self._fields[k].name!r}, expected {cnt}")
            dst[...] = src


def run_runner_process(runner: Runner, body: Callable[[], int], *, name: str,
                       before_close: Callable[[], None] | None = None) -> int:
    """``body()`` as the work of a runner process, its exit status returned. SIGTERM unwinds out of the
    model or the exchange (SystemExit is no model error: no FAIL is sent); an exception is printed
    as ``NAME: error: ...`` and FAILs the member held; either way ``before_close()`` runs, then the
    runner says BYE (a second SIGTERM must not cut it short). A runner that ``enkflow run`` started
    watches its lease from its construction (:class:`Runner`): once it lapses, SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _leave)
    try:
        return body()
    except Exception as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        if runner.task:
            runner.fail(f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if before_close is not None:
                before_close()
        finally:
            runner.close()
            signal.signal(signal.SIGTERM, previous)


def _leave(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)
