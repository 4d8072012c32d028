"""Bad input from a native runner (a C program built against the installed library with pkg-config):
fields the server does not expect (an unknown field, another dtype, another shape, an assimilated
integer), a wrong token, arrays bound with the wrong type, size or name, a forecast holding NaN. Each
gets a clear error code and message at the runner; the server (the one-rank server of
tests/online/test_online_bad_input.py, in a thread) keeps serving the good C runners, finishes the study,
and its final ensemble is bitwise the fault-free one."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from enkflow.jobs.events import EventLog, iter_events
from enkflow.online import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "online"))
import test_online_bad_input as ring  # noqa: E402  (the ring problem and its offline result)

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def bad_runner(native_build, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native/bad_runner.c compiled with the flags ``pkg-config enkflow_runner`` gives."""
    env = native_build.env()
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner"], env=env, capture_output=True,
                           text=True)
    assert flags.returncode == 0, f"pkg-config does not find the installed enkflow_runner.pc: {flags.stderr}"
    exe = tmp_path_factory.mktemp("bad-runner") / "bad_runner"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(HERE / "bad_runner.c"), "-o", str(exe),
                         *flags.stdout.split(), f"-Wl,-rpath,{native_build.lib}", "-lm"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return exe


def _run(exe: Path, address: str, mode: str, token: str = ring.TOKEN) -> tuple[int, list[str]]:
    p = subprocess.run([str(exe), address, token, mode], capture_output=True, text=True, timeout=60)
    return p.returncode, [line for line in p.stdout.splitlines() if line.startswith("rc=")]


def test_bad_input_from_native_runners(bad_runner: Path, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    # No member before the three runners started below have joined: none may find the study over already.
    server = Server(ring.problem(), ring.server_config(min_runners=3), events=EventLog(log))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(ring.CYCLES)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    # Refused at HELLO, before any member is handed out: the error names the difference.
    expected = {
        "unknown-field": ["rc=7 refused by the server: ", "unknown field 'salinity'"],
        "unicode-field": ["rc=7 refused by the server: ", "unknown field 'température ℃ 🌊'"],
        "wrong-dtype": ["rc=7 refused by the server: ", "field 'x': dtype 'float32', the server expects 'float64'"],
        "wrong-shape": ["rc=7 refused by the server: ", "field 'x': shape (41,), the server expects (40,)"],
        "carried-int": ["rc=7 refused by the server: ", "field 'x': assimilated False, the server expects True"],
    }
    for mode, parts in expected.items():
        rc, lines = _run(bad_runner, server.address, mode)
        assert rc == 0, (mode, rc, lines)
        assert lines and all(p in lines[-1] for p in parts), (mode, lines)
    rc, lines = _run(bad_runner, server.address, "carried-int")
    assert "rc=1 invalid argument: field 'x': an assimilated field must be float32 or float64, not int32" in lines[0]
    rc, lines = _run(bad_runner, server.address, "good", token="a-wrong-token")
    assert rc == 0 and "authentication failed: wrong token" in lines[-1], lines
    # Checked by the library itself.
    rc, lines = _run(bad_runner, server.address, "bind-checks")
    assert rc == 0, (rc, lines)
    assert lines == [
        "rc=5 wrong element type: field 'x' is float64, the array bound to it is float32",
        "rc=6 wrong element count: field 'x' has 40 elements on this rank, the array bound to it 39",
        "rc=4 no such field: field 'y' was not declared (declared: 'x')",
        "rc=2 call out of order: enkflow_runner_expose before a successful enkflow_runner_init",
    ], lines

    # The study goes on: two good runners and one whose first forecast holds a NaN.
    procs = {m: subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, m], stdout=subprocess.PIPE, text=True)
             for m in ("good", "nan")}
    good2 = subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, "good"], stdout=subprocess.PIPE, text=True)
    thread.join(60)
    assert not thread.is_alive(), "the server did not finish the study"
    assert not failure, failure
    outs = {m: p.communicate(timeout=30) for m, p in procs.items()}
    good2.communicate(timeout=30)
    assert procs["good"].returncode == 0 and good2.returncode == 0, outs
    nan_lines = [line for line in outs["nan"][0].splitlines() if line.startswith("rc=")]
    assert nan_lines and nan_lines[0].startswith("rc=7 refused by the server: the server rejected the forecast of member"), nan_lines
    assert "is nan (NaN or Inf in the forecast)" in nan_lines[0], nan_lines
    assert procs["nan"].returncode == 0, outs["nan"]

    np.testing.assert_array_equal(np.array(server.store.parts[0]), ring.offline_result())
    ev = list(iter_events(log))
    rejects = [e for e in ev if e["event"] == "online_reject"]
    assert len(rejects) >= 7, rejects  # five field mismatches, the wrong token, the NaN forecast
    assert [e["reason"] for e in ev if e["event"] == "task_requeue"] == ["rejected"]


def test_a_native_runner_talks_to_an_encrypting_server(bad_runner: Path) -> None:
    """``[online] curve = true``: the C runners, given the server's public key, serve the whole study through
    CURVE-encrypted sockets (control, data and heartbeats)."""
    import zmq

    public, secret = zmq.curve_keypair()
    server = Server(ring.problem(), ring.server_config(curve_secret_key=secret.decode(), min_runners=2))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(ring.CYCLES)
        except BaseException as exc:  # noqa: BLE001
            failure.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    plain = subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, "good"], stdout=subprocess.PIPE, text=True)
    procs = [subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, "good", public.decode()],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    thread.join(60)
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert not thread.is_alive() and not failure, (failure, outs)
    assert [p.returncode for p in procs] == [0, 0], outs
    # Without the key the handshake never completes: nothing is served, the runner gives up after reconnect_s.
    out = plain.communicate(timeout=30)[0]
    assert plain.returncode != 0 and "rc=8 the server went away: no enkflow server answered" in out, out
    np.testing.assert_array_equal(np.array(server.store.parts[0]), ring.offline_result())


def test_sigterm_ends_a_wait_for_the_server(bad_runner: Path) -> None:
    """A runner waiting for a task (the server hands none out before 3 runners joined) gets SIGTERM: its stop
    flag ends the wait (ENKFLOW_EINTR), it says BYE and exits; the server goes on with the next runners."""
    import signal
    import time

    server = Server(ring.problem(), ring.server_config(min_runners=3))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(ring.CYCLES)
        except BaseException as exc:  # noqa: BLE001
            failure.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    waiter = subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, "wait-sigterm"], stdout=subprocess.PIPE,
                              text=True)
    assert waiter.stdout.readline().strip() == "waiting"
    time.sleep(0.5)  # into its wait for a task
    waiter.send_signal(signal.SIGTERM)
    out = waiter.communicate(timeout=10)[0]  # a wait for a task is otherwise unbounded
    assert waiter.returncode == 0, out
    assert "rc=12 interrupted: interrupted: the stop flag was set while waiting for the server" in out, out
    procs = [subprocess.Popen([str(bad_runner), server.address, ring.TOKEN, "good"], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    thread.join(60)
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert not thread.is_alive() and not failure and [p.returncode for p in procs] == [0, 0, 0], (failure, outs)
    np.testing.assert_array_equal(np.array(server.store.parts[0]), ring.offline_result())
