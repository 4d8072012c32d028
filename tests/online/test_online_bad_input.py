"""Bad input to an online server (acceptance criterion 5).

Every case runs a real server (one rank, in a thread) with well-behaved runners
(threads using :class:`Runner` and a deterministic model) and a misbehaving
client, and checks that

* the bad client gets a clear error (a :class:`ServerError` or an ERROR reply
  naming the problem),
* the server says so in its event log,
* the server goes on serving the other runners, and
* nothing of a rejected message reaches the ensemble: the final ensemble is
  bitwise the one of a fault-free run.

Crafted messages go through raw ZeroMQ DEALER sockets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq

from enkflow.analysis import ETKF, ObsSet
from enkflow.errors import ConfigError, EnkflowError, MemberError
from enkflow.experiment.cycling import ArrayStore, ObservationSpace
from enkflow.experiment.step import AnalysisStep, analyse
from enkflow.jobs.events import EventLog, iter_events
from enkflow.online import Field, Problem, Runner, SchedulerConfig, Server, ServerConfig, ServerError
from enkflow.online import server as server_module
from enkflow.online.segments import MappedSegments
from enkflow.transport import Transport
from enkflow.online.store import MemoryStore
from enkflow.online.wire import (HEADER_SIZE, MAX_JSON_BYTES, NO_SLOT, PROTOCOL_VERSION, Header, Kind, credential, decode_json,
                                 encode_index, encode_json)
from enkflow.shm_names import shm_dir

TOKEN = "the-right-token"
N_X = 40
N_MEMBERS = 4
CYCLES = [1, 2]
NSTEPS = 3
FIELDS = (Field("x", "float64", (N_X,)),)
WAIT_S = 20.0  # the longest any step of a test may take
HERE = Path(__file__).parent


# -- the problem: 1 field of 40 float64, 4 members, ETKF, H = I ------------------------------------------


def initial_ensemble() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((N_X, N_MEMBERS))


def model(x: np.ndarray, cycle: int, nsteps: int) -> np.ndarray:
    """A deterministic model step: diffusion on a ring plus a cycle-dependent forcing."""
    y = np.array(x, dtype=np.float64)
    for _ in range(nsteps):
        y = y + 0.2 * (np.roll(y, 1) - 2 * y + np.roll(y, -1)) + 0.01 * cycle
    return y


class IdentityObs(ObservationSpace):
    """Every variable observed (H = I) with fixed, cycle-dependent values."""

    def observations(self, cycle: int) -> ObsSet:
        y = np.sin(np.arange(N_X) * 0.3 + cycle)
        return ObsSet(y, np.full(N_X, 0.25), np.arange(N_X, dtype=float))

    def apply(self, cycle, X, row_start, comm):
        return comm.allgather_rows(np.array(X, order="C"))

    def apply_analysis(self, cycle, Xa, row_start, comm):
        return comm.allgather_rows(np.array(Xa, order="C"))


def problem() -> Problem:
    X0 = initial_ensemble()

    def initial(store: MemoryStore) -> None:
        lo, hi = store.ranges[0]
        store.parts[0][...] = X0[lo:hi]

    return Problem(FIELDS, N_MEMBERS, initial, lambda cycle: NSTEPS, IdentityObs(), AnalysisStep(ETKF()))


def offline_result() -> np.ndarray:
    """The same cycles without any server: the members advanced in turn, then :func:`analyse`."""
    store = ArrayStore(initial_ensemble())
    for k in CYCLES:
        store.X = np.asfortranarray(np.stack([model(store.X[:, m], k, NSTEPS) for m in range(N_MEMBERS)], axis=1))
        analyse(AnalysisStep(ETKF()), store, IdentityObs(), k)
    return np.array(store.X)


# -- the server in a thread and the good runners ---------------------------------------------------


def server_config(max_failures: int = 3, heartbeat_timeout_s: float = 10.0, **kw) -> ServerConfig:
    return ServerConfig(token=TOKEN, heartbeat_s=0.2, heartbeat_timeout_s=heartbeat_timeout_s,
                        scheduler=SchedulerConfig(due_floor=60.0, max_failures=max_failures), **kw)


class Study:
    """A one-rank server running ``CYCLES`` in a thread (or, with ``address``, the server another
    process runs, logging to ``tmp/events.jsonl``); good runner threads on demand."""

    def __init__(self, tmp: Path, *, address: str | None = None, **kw):
        self.events_path = tmp / "events.jsonl"
        self.log: list[str] = []
        self.error: BaseException | None = None
        self.runner_errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        if address is not None:
            self.address = address
            return
        self.server = Server(problem(), server_config(**kw), events=EventLog(self.events_path), progress=self.log.append)
        self.address = self.server.address
        self._thread = threading.Thread(target=self._serve, name="test-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.server.run(CYCLES)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc

    def runner(self, name: str, *, gate: "Gate | None" = None,
               corrupt: Callable[[int, int, np.ndarray], None] | None = None) -> None:
        """Start a runner thread; ``gate`` holds it inside its first forecast of cycle 1, ``corrupt(cycle,
        member, x)`` may spoil a forecast. A forecast the server rejects is reported and the runner goes on
        (as a replaced runner process would)."""

        def run() -> None:
            r = Runner(self.address, TOKEN, name=name, timeout_s=WAIT_S, reconnect_s=2.0)
            try:
                r.init(FIELDS)
                x = np.zeros(N_X)
                held = False
                x, n = r.expose(x)
                while n:
                    if gate is not None and r.cycle == 1 and not held:
                        held = True
                        gate.arrive()
                    x[...] = model(x, r.cycle, n)
                    if corrupt is not None:
                        corrupt(r.cycle, r.member, x)
                    try:
                        x, n = r.expose(x)
                    except ServerError as exc:
                        self.runner_errors.append(f"{name}: {exc}")
                        x, n = r.expose(x)
            except Exception as exc:  # noqa: BLE001 - a lost server after the study stopped, inspected below
                self.runner_errors.append(f"{name}: {type(exc).__name__}: {exc}")
            finally:
                r.close()

        t = threading.Thread(target=run, name=f"test-runner-{name}", daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(WAIT_S * 3)
            assert not self._thread.is_alive(), f"the server did not finish; its log: {self.log}"
        for t in self.threads:
            t.join(WAIT_S)
            assert not t.is_alive(), f"runner {t.name} did not finish"

    def finish(self) -> np.ndarray:
        """Wait for the study; the final ensemble (fails if the server failed)."""
        self.join()
        if self.error is not None:
            raise AssertionError(f"the server failed: {self.error!r}; its log: {self.log}")
        return np.array(self.server.store.parts[0])

    def events(self, name: str | None = None) -> list[dict]:
        return [e for e in iter_events(self.events_path) if name is None or e["event"] == name]


class Gate:
    """Good runners wait here (inside a forecast, so they hold their task) until the bad client is done."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._cond = threading.Condition()
        self.arrived = 0

    def arrive(self) -> None:
        with self._cond:
            self.arrived += 1
            self._cond.notify_all()
        assert self._open.wait(WAIT_S * 2), "the gate was never opened"

    def wait_arrived(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.arrived >= n, WAIT_S), f"only {self.arrived} of {n} runners arrived"

    def open(self) -> None:
        self._open.set()


class RawClient:
    """A hand-driven client on a raw DEALER socket, for crafted messages."""

    def __init__(self, address: str, token: str = TOKEN, runner: int = 0xBAD):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.cred = credential(token)
        self.runner = runner
        self.epoch = 0  # the server incarnation that welcomed this client (join_raw sets it)

    def header(self, kind: Kind, **kw: int) -> bytes:
        return Header(kind, self.cred, self.runner, **({"epoch": self.epoch} | kw)).pack()

    def send(self, *frames: object) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self) -> tuple[Header, list[bytes]]:
        assert self.sock.poll(WAIT_S * 1000), "no reply from the server"
        frames = self.sock.recv_multipart()
        return Header.unpack(frames[0]), frames[1:]

    def error(self) -> str:
        """The next reply, which must be an ERROR; its message."""
        hdr, frames = self.recv()
        assert hdr.kind is Kind.ERROR, f"expected an ERROR reply, got {hdr.kind.name}"
        return str(decode_json(frames[0], "error")["error"])

    def close(self) -> None:
        self.sock.close(0)


def join_raw(study: Study, runner: int = 0xBAD) -> tuple[RawClient, list[RawClient], Header]:
    """A raw client that greets the server properly and takes a task: control, data sockets, the TASK."""
    c = RawClient(study.address, runner=runner)
    c.send(c.header(Kind.HELLO), encode_json({"name": "raw", "fields": [f.as_json() for f in FIELDS], "ranks": 1}))
    hdr, frames = c.recv()
    assert hdr.kind is Kind.WELCOME
    welcome = decode_json(frames[0], "welcome")
    c.epoch = int(welcome["epoch"])
    data = [RawClient(a, runner=runner) for a in welcome["data"]]
    for d in data:
        d.epoch = c.epoch
    c.send(c.header(Kind.READY))
    task, _ = c.recv()
    assert task.kind is Kind.TASK and task.cycle == 1
    return c, data, task


def put_frames(c: RawClient, task: Header, pieces: list[tuple[int, int, int]], arrays: list[bytes], *,
               count: int | None = None) -> list[object]:
    hdr = c.header(Kind.PUT, task=task.task, member=task.member, cycle=task.cycle,
                   count=len(pieces) if count is None else count)
    return [hdr, encode_index(np.array(pieces, dtype=np.int64).reshape(-1, 3)), *arrays]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """The final ensemble of a fault-free run with two runners (and the same as without any server)."""
    study = Study(tmp_path_factory.mktemp("reference"))
    study.runner("good-1")
    study.runner("good-2")
    X = study.finish()
    assert not study.runner_errors
    assert not study.events("online_reject") and not study.events("task_requeue")
    np.testing.assert_array_equal(X, offline_result())
    assert not np.array_equal(X, initial_ensemble())
    return X


def gated_study(tmp: Path, **kw) -> tuple[Study, Gate]:
    """A study whose two good runners hold members in cycle 1 until the gate opens."""
    study = Study(tmp, **kw)
    gate = Gate()
    study.runner("good-1", gate=gate)
    study.runner("good-2", gate=gate)
    gate.wait_arrived(2)
    return study, gate


def rejects(study: Study) -> list[str]:
    return [str(e.get("reason")) for e in study.events("online_reject")]


# -- authentication ------------------------------------------------------------------------------------


def test_wrong_token_is_refused_on_every_socket_and_the_study_goes_on(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    # A runner with another token cannot join.
    bad = Runner(study.address, "not-the-token", name="intruder", timeout_s=WAIT_S, reconnect_s=2.0)
    with pytest.raises(ServerError, match="authentication failed: wrong token"):
        bad.init(FIELDS)
    bad.close()
    # Nor can crafted messages with a wrong credential: READY on the control socket, PUT/GET on a data socket.
    c = RawClient(study.address, token="not-the-token")
    c.send(c.header(Kind.READY))
    assert "authentication failed: wrong token" in c.error()
    data_address = study.server.data_addresses[0]
    d = RawClient(data_address, token="not-the-token")
    d.send(*put_frames(d, Header(Kind.TASK, task=1, member=1, cycle=1), [(0, 0, N_X)], [np.full(N_X, 1e9).tobytes()]))
    assert "authentication failed: wrong token" in d.error()
    d.send(d.header(Kind.GET, task=1, member=1, cycle=1, count=1), encode_index(np.array([[0, 0, N_X]])))
    assert "authentication failed: wrong token" in d.error()
    c.close()
    d.close()
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    wrong = [e for e in study.events("online_reject") if "wrong token" in e["reason"]]
    assert {e.get("socket", "control") for e in wrong} == {"control", "data"} and len(wrong) >= 5
    assert not study.runner_errors
    assert not [e for e in study.events("runner_join") if e["runner"] == "intruder"]


# -- fields at init ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, expected", [
    ((Field("y", "float64", (N_X,)),), ["unknown field 'y'", "field 'x' missing"]),
    ((Field("x", "float64", (N_X + 1,)),), ["field 'x': shape (41,), the server expects (40,)"]),
    ((Field("x", "float32", (N_X,)),), ["field 'x': dtype 'float32', the server expects 'float64'"]),
    ((Field("x", "float64", (N_X,)), Field("z", "int32", (3,), assimilated=False)), ["unknown field 'z'"]),
    ((Field("x", "float64", (N_X,), assimilated=False),), ["field 'x': assimilated False, the server expects True"]),
], ids=["name", "size", "dtype", "extra", "carried"])
def test_fields_that_do_not_match_are_refused_at_init(tmp_path: Path, reference: np.ndarray, fields, expected) -> None:
    study, gate = gated_study(tmp_path)
    bad = Runner(study.address, TOKEN, name="mismatch", timeout_s=WAIT_S, reconnect_s=2.0)
    with pytest.raises(ServerError, match="the runner's fields do not match the server's") as ei:
        bad.init(fields)
    bad.close()
    for text in expected:
        assert text in str(ei.value)
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    (reason,) = [r for r in rejects(study)]
    for text in expected:
        assert text in reason
    assert not [e for e in study.events("runner_join") if e["runner"] == "mismatch"]


@pytest.mark.parametrize("body, expected", [
    (b"\xff not json", "bad HELLO: the hello metadata frame is not valid JSON"),
    (b"[1, 2]", "bad HELLO: the hello metadata frame is not a JSON object"),
    (b"{" + b" " * MAX_JSON_BYTES + b"}", f"more than {MAX_JSON_BYTES}"),
    (json.dumps({"fields": 5}).encode(), "bad HELLO"),
    (json.dumps({"fields": ["x"]}).encode(), "bad HELLO: bad field description"),
    (json.dumps({"fields": [{"name": "x", "dtype": "float64", "shape": [-1]}]}).encode(), "negative extent"),
    (json.dumps({"fields": [f.as_json() for f in FIELDS], "ranks": "many"}).encode(), "bad HELLO"),
], ids=["not-json", "not-object", "oversize", "fields-not-list", "field-not-object", "negative-shape", "ranks"])
def test_a_malformed_hello_is_refused(tmp_path: Path, reference: np.ndarray, body: bytes, expected: str) -> None:
    study, gate = gated_study(tmp_path)
    c = RawClient(study.address)
    c.send(c.header(Kind.HELLO), body)
    assert expected in c.error()
    c.close()
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    assert [r for r in rejects(study) if expected in r]


# -- protocol version ----------------------------------------------------------------------------------


def test_another_protocol_version_is_refused_naming_both(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c = RawClient(study.address)
    hello = Header(Kind.HELLO, c.cred, c.runner, version=99).pack()
    c.send(hello, encode_json({"name": "future", "fields": [f.as_json() for f in FIELDS]}))
    msg = c.error()
    assert "protocol version mismatch" in msg and "version 99" in msg and f"version {PROTOCOL_VERSION}" in msg
    d = RawClient(study.server.data_addresses[0])
    d.send(Header(Kind.GET, d.cred, d.runner, 1, 1, 1, count=1, version=99).pack(), encode_index(np.array([[0, 0, N_X]])))
    assert "protocol version mismatch" in d.error()
    # Not an enkflow message at all: a short header, a wrong magic.
    c.send(b"GET / HTTP/1.1\r\n")
    assert f"expected {HEADER_SIZE}" in c.error()
    c.send(b"XXXX" + hello[4:])
    assert "bad magic" in c.error()
    c.close()
    d.close()
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    assert len([r for r in rejects(study) if "version 99" in r]) == 2  # control and data socket
    assert not [e for e in study.events("runner_join") if e["runner"] == "future"]


def test_a_runner_meeting_a_server_of_another_version_says_so(tmp_path: Path) -> None:
    """The runner side of a version mismatch: a (fake) server answering in protocol version 99."""
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if fake.poll(100):
                ident, hdr, *_ = fake.recv_multipart()
                h = Header.unpack(hdr)
                fake.send_multipart([ident, Header(Kind.ERROR, h.credential, h.runner, version=99).pack(),
                                     encode_json({"error": "speak version 99"})])

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        r = Runner(f"tcp://127.0.0.1:{port}", TOKEN, timeout_s=5.0, reconnect_s=3.0)
        t0 = time.monotonic()
        with pytest.raises(ServerError, match="protocol version mismatch") as ei:
            r.init(FIELDS)
        assert "version 99" in str(ei.value) and time.monotonic() - t0 < 2.5  # at once, not after a time-out
        r.close()
    finally:
        stop.set()
        t.join()
        fake.close(0)


# -- oversize and truncated messages -------------------------------------------------------------------


def _garbage(n: int) -> bytes:
    return np.full(n, 1e9).tobytes()


BAD_PUTS = {
    # fewer frames than announced: 2 pieces, 1 frame
    "missing-frame": (lambda: ([(0, 0, 20), (0, 20, 20)], [_garbage(20)], None), "1 data frames for 2 announced pieces"),
    # more frames than announced
    "extra-frame": (lambda: ([(0, 0, N_X)], [_garbage(N_X), _garbage(1)], None), "2 data frames for 1 announced pieces"),
    # a frame larger than its piece
    "frame-too-large": (lambda: ([(0, 0, N_X)], [_garbage(N_X + 1)], None), "a frame of 328 bytes for 40 float64 elements"),
    # a frame smaller than its piece (truncated), and one of another dtype
    "frame-truncated": (lambda: ([(0, 0, N_X)], [_garbage(N_X)[:-3]], None), "a frame of 317 bytes for 40 float64"),
    "frame-float32": (lambda: ([(0, 0, N_X)], [np.zeros(N_X, np.float32).tobytes()], None), "a frame of 160 bytes"),
    # a piece outside the rank's range, an unknown field, an empty piece
    "outside-range": (lambda: ([(0, 30, 20)], [_garbage(20)], None), "elements [30, 50) are not within [0, 40)"),
    "negative-offset": (lambda: ([(0, -5, 10)], [_garbage(10)], None), "elements [-5, 5) are not within [0, 40)"),
    "unknown-field": (lambda: ([(1, 0, N_X)], [_garbage(N_X)], None), "field index 1 outside 0..0"),
    # an index that does not match the announced count, a count far too large
    "index-count": (lambda: ([(0, 0, N_X)], [_garbage(N_X)], 2), "the piece index has 24 bytes, expected 48"),
    "count-huge": (lambda: ([(0, 0, N_X)], [_garbage(N_X)], 1 << 40), "pieces announced; too many"),
}


@pytest.mark.parametrize("case", sorted(BAD_PUTS))
def test_a_malformed_forecast_is_rejected_and_its_member_rerun(tmp_path: Path, reference: np.ndarray, case: str) -> None:
    make, expected = BAD_PUTS[case]
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    # First a valid half of the forecast (garbage values, staged), then the malformed message: the
    # staged half must be dropped with it, and the member run again by a good runner.
    d.send(*put_frames(c, task, [(0, 0, 20)], [_garbage(20)]))
    ack, _ = d.recv()
    assert ack.kind is Kind.ACK
    pieces, arrays, count = make()
    d.send(*put_frames(c, task, pieces, arrays, count=count))
    msg = d.error()
    assert expected in msg
    # A complete forecast for the dropped task now: acknowledged, but too late to count.
    d.send(*put_frames(c, task, [(0, 0, N_X)], [_garbage(N_X)]))
    assert d.recv()[0].kind is Kind.ACK
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    (rq,) = study.events("task_requeue")
    assert rq["member"] == task.member and rq["reason"] == "rejected" and expected in rq["error"]
    (rj,) = [e for e in study.events("online_reject") if expected in e["reason"]]
    assert rj["socket"] == "data" and rj["rank"] == 0 and rj["runner"] == c.runner and rj["kind"] == "PUT"
    assert not [e for e in study.events("task_done") if e["task"] == task.task]
    assert not study.runner_errors
    c.close()
    d.close()


def test_a_get_outside_the_ranks_range_is_refused(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    d.send(d.header(Kind.GET, task=task.task, member=task.member, cycle=1, count=1), encode_index(np.array([[0, 10, 40]])))
    assert "elements [10, 50) are not within [0, 40)" in d.error()
    d.send(d.header(Kind.GET, task=task.task, member=N_MEMBERS + 1, cycle=1, count=1), encode_index(np.array([[0, 0, 40]])))
    assert f"member {N_MEMBERS + 1} outside 1..{N_MEMBERS}" in d.error()
    d.send(d.header(Kind.GET, task=task.task, member=task.member, cycle=1, count=1))
    assert "the piece index frame is missing" in d.error()
    # A proper GET still works on the same socket.
    d.send(d.header(Kind.GET, task=task.task, member=task.member, cycle=1, count=1), encode_index(np.array([[0, 0, 40]])))
    hdr, frames = d.recv()
    assert hdr.kind is Kind.DATA and len(frames) == 2
    np.testing.assert_array_equal(np.frombuffer(frames[1]), initial_ensemble()[:, task.member - 1])
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    (rq,) = study.events("task_requeue")
    assert rq["member"] == task.member and rq["reason"] == "left"
    c.close()
    d.close()


def test_a_malformed_fail_report_does_not_stop_the_server(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    c.send(c.header(Kind.FAIL, task=task.task, member=task.member, cycle=1), b"\xff not json")
    assert "not valid JSON" in c.error()
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    c.close()
    d.close()


# -- NaN in an exposed state ---------------------------------------------------------------------------


def test_a_runner_exposing_nan_is_rejected_and_the_member_rerun(tmp_path: Path, reference: np.ndarray) -> None:
    study = Study(tmp_path)
    spoilt: list[int] = []

    def nan_once(cycle: int, member: int, x: np.ndarray) -> None:
        if not spoilt:
            spoilt.append(member)
            x[7] = np.nan

    study.runner("nan", corrupt=nan_once)
    study.runner("good")
    np.testing.assert_array_equal(study.finish(), reference)
    (m,) = spoilt
    (err,) = study.runner_errors
    assert err.startswith("nan: ") and f"the server rejected the forecast of member {m}, cycle 1" in err
    assert "element 7 is nan (NaN or Inf in the forecast)" in err
    (rq,) = study.events("task_requeue")
    assert rq["member"] == m and rq["reason"] == "rejected" and "element 7 is nan" in rq["error"]  # an error: a failure
    end1 = [e for e in study.events("online_cycle_end") if e["cycle"] == 1][0]
    assert end1["redone_rejected"] == 1.0 and end1["tasks"] == N_MEMBERS + 1


def test_an_inf_anywhere_in_a_piece_is_rejected(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    x = initial_ensemble()[:, task.member - 1].copy()
    x[33] = -np.inf
    d.send(*put_frames(c, task, [(0, 0, N_X)], [x.tobytes()]))
    assert "element 33 is -inf" in d.error()
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    c.close()
    d.close()


def test_a_member_nan_on_every_runner_stops_the_study_naming_it(tmp_path: Path) -> None:
    study = Study(tmp_path, max_failures=3)

    def nan_member_2(cycle: int, member: int, x: np.ndarray) -> None:
        if member == 2:
            x[0] = np.nan

    study.runner("r1", corrupt=nan_member_2)
    study.runner("r2", corrupt=nan_member_2)
    study.join()
    assert isinstance(study.error, MemberError), study.error
    assert study.error.member == 2 and study.error.cycle == 1
    msg = str(study.error)
    assert msg.startswith("member 2, cycle 1: the forecast failed on 3 runners (online.max_failures = 3)")
    assert msg.count("element 0 is nan") == 3
    assert len([e for e in study.events("task_requeue") if e["member"] == 2]) == 2  # the third stopped the study
    (fail,) = study.events("experiment_fail")
    assert fail["member"] == 2
    rejected = [e for e in study.runner_errors if "the server rejected the forecast of member 2" in e]
    assert len(rejected) == 3, study.runner_errors
    # Otherwise the runners were told to stop, or found the server gone (ServerLost, whichever way they noticed:
    # no answer to a greeting, no reply to a request, the server gone; not another error).
    others = [e for e in study.runner_errors if e not in rejected and ": ServerLost: " not in e]
    assert others == [], "\n".join(study.runner_errors)


# -- N-to-M: a piece sent to a server rank that does not own it -------------------------------------------


@pytest.mark.mpi
def test_a_piece_sent_to_a_rank_that_does_not_own_it_is_rejected(tmp_path: Path, reference: np.ndarray, mpiexec: str,
                                                                  subprocess_env: dict[str, str]) -> None:
    """A two-rank server (rank 0 owns elements [0, 20), rank 1 [20, 40)): rank 1 refuses rank 0's
    elements, the half rank 0 had staged for the task is dropped, and the member is run again."""
    server = subprocess.Popen([mpiexec, "-n", "2", sys.executable, str(HERE / "bad_input_server.py"), str(tmp_path)],
                              env=subprocess_env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "address").exists():
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        study = Study(tmp_path, address=(tmp_path / "address").read_text().strip())
        gate = Gate()
        study.runner("good-1", gate=gate)
        study.runner("good-2", gate=gate)
        gate.wait_arrived(2)
        # The ranks' internal bus listens on loopback too: junk and forged reports from another local
        # process are dropped (one used to stop the server).
        bus = RawClient((tmp_path / "bus").read_text().strip())
        bus.send(b"junk")
        bus.send(b"\0" * 34)
        bus.send(credential("not-the-token"), b"\0" * 34)
        bus.send(bus.cred, b"\1" * 33)
        c, (d0, d1), task = join_raw(study)
        d0.send(*put_frames(c, task, [(0, 0, 20)], [_garbage(20)]))
        assert d0.recv()[0].kind is Kind.ACK
        d1.send(*put_frames(c, task, [(0, 0, 20)], [_garbage(20)]))
        assert "elements [0, 20) are not within [20, 40), which server rank 1 owns" in d1.error()
        while not study.events("task_requeue"):  # rank 1's report reaches rank 0 over the bus (before the BYE)
            assert time.monotonic() < deadline, "the rejection was not reported"
            time.sleep(0.02)
        c.send(c.header(Kind.BYE))
        gate.open()
        assert server.wait(timeout=WAIT_S * 3) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    study.join()
    assert not study.runner_errors
    np.testing.assert_array_equal(np.load(tmp_path / "final.npy"), reference)
    (rj,) = [e for e in study.events("online_reject") if e["socket"] == "data"]
    assert rj["rank"] == 1 and "which server rank 1 owns" in rj["reason"]
    assert len([e for e in study.events("online_reject") if e["socket"] == "bus"]) == 4
    (rq,) = study.events("task_requeue")
    assert rq["member"] == task.member and rq["reason"] == "rejected" and "server rank 1 rejected" in rq["error"]
    for x in (c, d0, d1, bus):
        x.close()


def test_a_put_meant_for_an_earlier_server_incarnation_is_refused_and_changes_nothing(
        tmp_path: Path, reference: np.ndarray) -> None:
    # A runner's socket reconnects to a restarted server and delivers the PUT it had queued for the old
    # one: the new server's task of the same id (another member, maybe) must not take it.
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    x = initial_ensemble()[:, task.member - 1].copy()
    d.send(d.header(Kind.PUT, task=task.task, member=task.member, cycle=task.cycle, count=1, epoch=c.epoch ^ 0x5A5A),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)), x.tobytes())
    assert "another incarnation of the server" in d.error()
    d.send(d.header(Kind.GET, task=task.task, member=task.member, cycle=task.cycle, count=1, epoch=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)))
    assert "greet again" in d.error()
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    assert not study.events("task_requeue") or all(e["reason"] != "rejected" for e in study.events("task_requeue"))
    c.close()
    d.close()


def test_another_members_data_under_a_task_id_is_not_taken_as_that_tasks_forecast(
        tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    other = task.member % N_MEMBERS + 1
    x = initial_ensemble()[:, other - 1].copy()
    d.send(d.header(Kind.PUT, task=task.task, member=other, cycle=task.cycle, count=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)), x.tobytes())
    d.recv()  # the data rank acknowledges the piece; rank 0 then drops it (not this task's member)
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    c.close()
    d.close()


def test_a_task_whose_get_failed_is_given_back_not_sent_as_a_forecast(tmp_path: Path, reference: np.ndarray) -> None:
    # The model catches the error of an interrupted GET and calls expose again: its array holds no
    # state of that member, so the task goes back (FAIL) instead of being PUT as the member's forecast.
    study = Study(tmp_path)
    sent: list[int] = []

    def run() -> None:
        r = Runner(study.address, TOKEN, name="interrupted", timeout_s=WAIT_S, reconnect_s=2.0)
        real_get, real_put = r._get, r._put
        calls = {"get": 0}

        def get(arrays):
            calls["get"] += 1
            if calls["get"] == 1:
                raise ServerError("interrupted while receiving the state")
            real_get(arrays)

        def put(arrays):
            sent.append(r.member)
            real_put(arrays)

        r._get, r._put = get, put
        try:
            r.init(FIELDS)
            x = np.full(N_X, -999.0)
            try:
                x, n = r.expose(x)
            except ServerError:
                x, n = r.expose(x)  # the model goes on
            while n:
                x[...] = model(x, r.cycle, n)
                x, n = r.expose(x)
        finally:
            r.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    np.testing.assert_array_equal(study.finish(), reference)
    t.join(WAIT_S)
    failed = [e for e in study.events("task_requeue") if e.get("reason") == "failed"]
    assert len(failed) == 1 and "never arrived" in json.dumps(study.events("task_fail") or failed)
    assert len(sent) == N_MEMBERS * len(CYCLES)  # every PUT was a real forecast; none for the failed task


# -- shared memory: the transport chosen, bad input and a runner stopped while it writes its slot ---------


def own_segments() -> list[Path]:
    """The online segments this process made (the servers of these tests run in it) that still exist."""
    return sorted(shm_dir().glob(f"enkflow-online-{os.getpid()}-*"))


def test_runners_choose_shared_memory_on_the_servers_node_and_both_ways_give_the_same_bits(
        tmp_path: Path, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    for sub in ("auto", "tcp"):
        (tmp_path / sub).mkdir()
    study = Study(tmp_path / "auto")  # the reference ran over shared memory (AUTO): runners on the server's node
    auto = Runner(study.address, TOKEN, name="auto", timeout_s=WAIT_S, reconnect_s=2.0)
    tcp = Runner(study.address, TOKEN, name="tcp", timeout_s=WAIT_S, reconnect_s=2.0, transport=Transport.TCP)
    auto.init(FIELDS)
    tcp.init(FIELDS)
    assert auto.in_place and not tcp.in_place
    with pytest.raises(EnkflowError, match="expose_in_place needs every piece of its fields in shared memory"):
        tcp.expose_in_place()
    tcp.close()
    # The interception's way: the model reads and writes the segments itself, the runner copies nothing.
    maps = MappedSegments()

    def in_place() -> None:
        extents, n = auto.expose_in_place()
        while n:
            (e,) = extents
            x = maps.view(e.read_path, e.read_offset, np.dtype(np.float64), e.hi - e.lo, writable=False)
            maps.view(e.write_path, e.write_offset, np.dtype(np.float64), e.hi - e.lo, writable=True)[...] = \
                model(x, auto.cycle, n)
            extents, n = auto.expose_in_place()
        auto.close()
        maps.clear()

    t = threading.Thread(target=in_place, daemon=True)
    t.start()
    study.runner("good-1")
    np.testing.assert_array_equal(study.finish(), reference)
    t.join(WAIT_S)
    assert not t.is_alive() and any(e["runner"] == "auto" for e in study.events("task_assign"))
    # A server without shared memory: AUTO runners use TCP, and give the same bits; SHM insists, and cannot.
    study = Study(tmp_path / "tcp", transport=Transport.TCP)
    shm = Runner(study.address, TOKEN, name="shm", timeout_s=WAIT_S, reconnect_s=2.0, transport=Transport.SHM)
    with pytest.raises(ServerError, match="shared memory was asked for, but server rank 0's store segment .none. cannot "
                                          "be used: the server rank has no shared memory"):
        shm.init(FIELDS)
    shm.close()
    study.runner("good-1")
    study.runner("good-2")
    np.testing.assert_array_equal(study.finish(), reference)
    assert not study.runner_errors and not own_segments()
    monkeypatch.setenv("ENKFLOW_TRANSPORT", "udp")
    with pytest.raises(ConfigError, match="ENKFLOW_TRANSPORT='udp' is not one of auto, shm, tcp"):
        Runner(study.address, TOKEN)


def test_a_server_without_shared_memory_serves_tcp_or_refuses_to_start(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "available", lambda: "no writable /dev/shm")
    with pytest.raises(ConfigError, match="shared memory was asked for but is unavailable: server rank 0: no writable"):
        Server(problem(), server_config(transport=Transport.SHM))
    server = Server(problem(), server_config(), events=EventLog(tmp_path / "events.jsonl"))
    server.close()
    (ev,) = [e for e in iter_events(tmp_path / "events.jsonl") if e["event"] == "online_shm_unavailable"]
    assert ev["reason"] == "server rank 0: no writable /dev/shm" and server.shm == [None]
    assert not own_segments()


def get_slot(c: RawClient, d: RawClient, task: Header) -> dict:
    """GET_SLOT of the raw client's task: the SLOT reply's JSON (where its state is, where its forecast goes)."""
    d.send(d.header(Kind.GET_SLOT, task=task.task, member=task.member, cycle=task.cycle, count=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)))
    hdr, frames = d.recv()
    assert hdr.kind is Kind.SLOT, f"expected SLOT, got {hdr.kind.name}"
    return decode_json(frames[1], "slot")


def test_a_bad_forecast_in_shared_memory_is_refused_as_over_tcp(tmp_path: Path, reference: np.ndarray) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    maps = MappedSegments()
    where = get_slot(c, d, task)
    state = maps.view(where["read"], where["at"][0][0], np.dtype(np.float64), N_X, writable=False)
    np.testing.assert_array_equal(state, initial_ensemble()[:, task.member - 1])
    # Elements the rank does not own: refused as a PUT of them is; the task goes back, its slot is retired.
    d.send(d.header(Kind.PUT_SLOT, task=task.task, member=task.member, cycle=1, count=1),
           encode_index(np.array([[0, 30, 20]], dtype=np.int64)))
    assert "elements [30, 50) are not within [0, 40)" in d.error()
    d.send(d.header(Kind.PUT_SLOT, task=task.task, member=task.member, cycle=1, count=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)))
    assert f"task {task.task} (member {task.member}) {NO_SLOT} 0: stale, or its state was never fetched" in d.error()
    # A NaN written into the slot: the message of a NaN sent over TCP.
    c.send(c.header(Kind.READY))
    task, _ = c.recv()
    where = get_slot(c, d, task)
    slot = maps.view(where["write"], where["at"][0][1], np.dtype(np.float64), N_X, writable=True)
    slot[...] = model(initial_ensemble()[:, task.member - 1], 1, NSTEPS)
    slot[7] = np.nan
    d.send(d.header(Kind.PUT_SLOT, task=task.task, member=task.member, cycle=1, count=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)))
    assert f"member {task.member}, field 'x': element 7 is nan (NaN or Inf in the forecast)" in d.error()
    maps.clear()
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    assert [e["reason"] for e in study.events("task_requeue")] == ["rejected", "rejected"]
    assert not own_segments()
    c.close()
    d.close()


@pytest.mark.parametrize("finite, expected", [
    (b"\x00", "element 7 is nan (NaN or Inf in the forecast)"),  # not vouched for: the server reads the slot
    (b"\x01\x01", "the finite frame holds 2 bytes for 1 pieces, each 0 or 1 expected"),
    (b"\x02", "the finite frame holds 1 bytes for 1 pieces, each 0 or 1 expected"),
    (None, "4 frames after the header of a PUT_SLOT (its index, then at most its finite frame)"),
])
def test_a_put_slot_whose_finite_frame_is_malformed_or_says_unchecked_is_refused_or_checked(
        tmp_path: Path, reference: np.ndarray, finite: bytes | None, expected: str) -> None:
    study, gate = gated_study(tmp_path)
    c, (d,), task = join_raw(study)
    maps = MappedSegments()
    where = get_slot(c, d, task)
    slot = maps.view(where["write"], where["at"][0][1], np.dtype(np.float64), N_X, writable=True)
    slot[...] = model(initial_ensemble()[:, task.member - 1], 1, NSTEPS)
    slot[7] = np.nan
    frames = [b"\x00"] * 3 if finite is None else [finite]
    d.send(d.header(Kind.PUT_SLOT, task=task.task, member=task.member, cycle=1, count=1),
           encode_index(np.array([[0, 0, N_X]], dtype=np.int64)), *frames)
    assert expected in d.error()
    maps.clear()
    c.send(c.header(Kind.BYE))
    gate.open()
    np.testing.assert_array_equal(study.finish(), reference)
    assert [e["reason"] for e in study.events("task_requeue")] == ["rejected"]
    assert not own_segments()
    c.close()
    d.close()


# The victim: its first forecast goes into the slot as garbage, then it stops itself (SIGSTOP) before
# the real forecast and the PUT_SLOT; the test kills it, or continues it once it was declared lost.
VICTIM = """
import os, signal, sys
import numpy as np
from enkflow.online import Runner
from enkflow.online.shm_exchange import ShmExchange
from test_online_bad_input import FIELDS, N_X, TOKEN, model
write = ShmExchange.write
def stop_in_write(self, extents, arrays, starts):
    ShmExchange.write = write
    write(self, extents, [np.full(N_X, 1e9)], starts)
    os.kill(os.getpid(), signal.SIGSTOP)
    write(self, extents, arrays, starts)
ShmExchange.write = stop_in_write
r = Runner(sys.argv[1], TOKEN, name="victim", timeout_s=20.0, reconnect_s=5.0)
r.init(FIELDS)
assert r.in_place
x = np.zeros(N_X)
x, n = r.expose(x)
while n:
    x[...] = model(x, r.cycle, n)
    x, n = r.expose(x)
r.close()
"""


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _wait(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        assert time.monotonic() < deadline, f"waited in vain for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("fault", ["kill", "cont"])
def test_a_runner_stopped_while_it_writes_its_slot_changes_nothing(tmp_path: Path, reference: np.ndarray,
                                                                   subprocess_env: dict[str, str], fault: str) -> None:
    """kill -9 in the middle of writing the forecast into the slot, or SIGSTOP past the heartbeat
    timeout and SIGCONT: the late PUT_SLOT is refused (the slot was retired), the member redone."""
    study = Study(tmp_path, heartbeat_timeout_s=1.0)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, study.address], cwd=HERE, env=subprocess_env)
    try:
        _wait(lambda: victim.poll() is not None or _stopped(victim.pid), "the victim to stop in its write")
        assert victim.poll() is None, "the victim ended before it wrote a forecast"
        gate = Gate()
        study.runner("good-1", gate=gate)
        study.runner("good-2", gate=gate)
        _wait(lambda: any(e["reason"] == "lost" for e in study.events("task_requeue")), "the victim to be lost")
        if fault == "kill":
            victim.kill()
        else:
            victim.send_signal(signal.SIGCONT)
            _wait(lambda: any(NO_SLOT in r for r in rejects(study)), "the late PUT_SLOT's refusal")
        gate.open()
        np.testing.assert_array_equal(study.finish(), reference)
        assert victim.wait(WAIT_S) == (-signal.SIGKILL if fault == "kill" else 0)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert [e["reason"] for e in study.events("task_requeue")] == ["lost"]
    assert not study.runner_errors and not own_segments()
