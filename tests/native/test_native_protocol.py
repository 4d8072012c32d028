"""Protocol corner cases of the C library against a scripted server (scripted_server.py): replies the
real server gives only in rare interleavings, on demand."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from enkflow.shm_names import shm_dir
from scripted_server import Retire, ScriptedServer

HERE = Path(__file__).resolve().parent
TOKEN = "scripted"


@pytest.fixture(scope="module")
def bad_runner(native_build, tmp_path_factory: pytest.TempPathFactory) -> Path:
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner"], env=native_build.env(),
                           capture_output=True, text=True, check=True).stdout.split()
    exe = tmp_path_factory.mktemp("protocol") / "bad_runner"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", str(HERE / "bad_runner.c"), "-o", str(exe), *flags,
                    f"-Wl,-rpath,{native_build.lib}", "-lm"], check=True)
    return exe


def run_to_end(bad_runner: Path, server: ScriptedServer, mode: str, timeout: float = 60,
               transport: str = "") -> subprocess.CompletedProcess:
    """``bad_runner MODE`` against ``server`` until it exits, with ENKFLOW_TRANSPORT=``transport``; the server
    is closed afterwards."""
    try:
        return subprocess.run([str(bad_runner), server.address, TOKEN, mode], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "ENKFLOW_TRANSPORT": transport})
    finally:
        server.close()


def rc_lines(p: subprocess.CompletedProcess) -> list[str]:
    """The runner's "rc=CODE NAME: MESSAGE" reports."""
    return [line for line in p.stdout.splitlines() if line.startswith("rc=")]


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_a_forecast_rejected_by_every_server_rank_does_not_fail_the_next_member(bad_runner: Path, shm: bool) -> None:
    """A NaN forecast whose pieces two server ranks both refuse: the runner reads the first ERROR and gives
    the task up; the second rank's ERROR, for that old task, must not be taken for the answer to the next
    task's GET (that failed a healthy member, and with max_failures could stop the study). The same through
    the ranks' shared memory (PUT_SLOT refused)."""
    server = ScriptedServer(TOKEN, [(1, 3, 1), (2, 4, 1)], shm=shm,
                            put_reply=lambda task, rank: "element 0 is nan (NaN or Inf in the forecast)" if task == 1
                            else None)
    p = run_to_end(bad_runner, server, "nan")
    lines = rc_lines(p)
    assert p.returncode == 0, (p.returncode, lines, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("rc=7 refused by the server: the server rejected the forecast "
                                                   "of member 3, cycle 1"), lines
    assert server.fails == [], server.fails
    # Member 4's forecast went to both ranks and was acknowledged.
    put = "PUT_SLOT" if shm else "PUT"
    assert (put, 2, 0) in server.received and (put, 2, 1) in server.received, server.received


def test_shared_memory_and_tcp_carry_the_same_forecasts(bad_runner: Path) -> None:
    """The good runner against two server ranks offering shared memory: by itself (ENKFLOW_TRANSPORT unset) it
    takes each member's state from the ranks' stores and puts its forecast into the task's slots (GET_SLOT,
    PUT_SLOT); with ENKFLOW_TRANSPORT=" TCP " (read as the Python runner reads it) it exchanges the bytes in
    messages (GET, PUT). The forecasts are the same bytes, each the model's step from its member's state. A
    segment name of a dead maker is swept at join."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = shm_dir() / f"enkflow-online-{dead.pid}-0badc0de"
    stale.write_bytes(b"")
    servers = {}
    try:
        for transport in ("", " TCP "):
            servers[transport] = server = ScriptedServer(TOKEN, [(1, 3, 1), (2, 4, 1)], shm=True)
            p = run_to_end(bad_runner, server, "good", transport=transport)
            assert p.returncode == 0, (p.stdout, p.stderr)
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)
    kinds = {t: sorted({k for k, _, rank in s.received if rank >= 0}) for t, s in servers.items()}
    assert kinds == {"": ["GET_SLOT", "PUT_SLOT"], " TCP ": ["GET", "PUT"]}, kinds
    assert servers[""].forecasts == servers[" TCP "].forecasts, (servers[""].forecasts, servers[" TCP "].forecasts)
    for (task, rank), data in servers[""].forecasts.items():
        np.testing.assert_array_equal(np.frombuffer(data), np.full(20, 2 + task + 0.01))  # members 3, 4; cycle 1


@pytest.mark.parametrize("transport, shm, said", [
    ("bogus", True, "rc=1 invalid argument: ENKFLOW_TRANSPORT='bogus' is not one of auto, shm, tcp"),
    ("shm", False, "rc=1 invalid argument: transport shm: server rank 0 offers no shared memory"),
    ("shm", "other-nonce", "rc=1 invalid argument: transport shm: the shared memory of server rank 0, "),
], ids=["invalid", "none-offered", "another-servers"])
def test_a_transport_the_runner_cannot_have_is_an_error_naming_why(bad_runner: Path, transport: str, shm: bool | str,
                                                                   said: str) -> None:
    """ENKFLOW_TRANSPORT holding another word than auto, shm, tcp; shm forced where the server offers none, or
    where the segment named is not that server's (its header's nonce differs): init fails, naming the variable,
    or the server rank, the segment and why. The runner does not join."""
    server = ScriptedServer(TOKEN, [(1, 3, 1)], shm=shm)
    store = server.shm[0].store if shm else ""
    p = run_to_end(bad_runner, server, "good", transport=transport)
    lines = rc_lines(p)
    assert len(lines) == 1 and lines[0].startswith(said), lines
    if shm == "other-nonce":
        assert store in lines[0] and "nonce" in lines[0], lines
    assert not [k for k, _, rank in server.received if rank >= 0], server.received


def test_the_librarys_threads_block_signals(bad_runner: Path) -> None:
    """A runner waiting for a task: every thread but the model's own (the heartbeat thread, ZeroMQ's) blocks
    SIGTERM, so the model's handler runs on its thread and interrupts its wait at once."""
    import glob
    import signal

    server = ScriptedServer(TOKEN, [], hold=True)
    try:
        p = subprocess.Popen([str(bad_runner), server.address, TOKEN, "wait-sigterm"], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "waiting"
        masks: dict[int, int] = {}
        for _ in range(10):  # several looks: a thread that is just starting has every signal blocked for a moment
            for path in glob.glob(f"/proc/{p.pid}/task/*/status"):
                fields = dict(line.split(":\t", 1) for line in Path(path).read_text().splitlines() if ":\t" in line)
                tid = int(path.split("/")[4])
                masks[tid] = masks.get(tid, -1) & int(fields["SigBlk"], 16)
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=10)[0]
    finally:
        server.close()
    assert p.returncode == 0, out
    others = {tid: m for tid, m in masks.items() if tid != p.pid}
    assert len(others) >= 3, masks  # the heartbeat thread and ZeroMQ's two
    term = 1 << (signal.SIGTERM - 1)
    assert all(m & term for m in others.values()), {tid: hex(m) for tid, m in masks.items()}


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_a_task_whose_state_never_arrived_is_given_back_not_sent_as_a_forecast(bad_runner: Path, shm: bool) -> None:
    """SIGTERM (the stop flag) ends the wait for a member's state (its DATA, or its SLOT): ENKFLOW_EINTR, the
    task held. A model that clears its flag and calls expose again must not send its arrays, which never
    received that member's state, as the member's forecast: the task is failed (given to another runner), then
    the runner serves on."""
    import signal

    server = ScriptedServer(TOKEN, [(1, 3, 1), (2, 4, 1)], ranks=1, hold_get={1}, shm=shm)
    get, put = ("GET_SLOT", "PUT_SLOT") if shm else ("GET", "PUT")
    try:
        p = subprocess.Popen([str(bad_runner), server.address, TOKEN, "retry-after-sigterm"], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "waiting"
        deadline = time.monotonic() + 20
        while (get, 1, 0) not in server.received:
            assert time.monotonic() < deadline, server.received
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=20)[0]
    finally:
        server.close()
    assert p.returncode == 0, out
    assert "rc=12 interrupted" in out, out
    assert (put, 1, 0) not in server.received, server.received
    assert len(server.fails) == 1 and "did not arrive" in server.fails[0], server.fails
    assert (put, 2, 0) in server.received, server.received


def test_a_forked_child_cannot_finalize_its_parents_runner(bad_runner: Path) -> None:
    """A model that forks after init (a helper process without exec) whose child finalizes its copy of the
    handle (an atexit handler): the child gets ENKFLOW_ESTATE at once. ZeroMQ's context is not fork-safe
    (the child has none of its threads: the BYE would hang in zmq_ctx_term, or say BYE for the parent's
    task); the parent serves on."""
    server = ScriptedServer(TOKEN, [(1, 3, 1)], ranks=1)
    p = run_to_end(bad_runner, server, "fork-finalize", timeout=30)
    assert p.returncode == 0, (p.returncode, p.stdout)
    assert "child rc=2" in p.stdout, p.stdout
    assert [k for k, _, _ in server.received].count("BYE") == 1 and ("PUT", 1, 0) in server.received, server.received


def mapped(pid: int, paths: list[str]) -> list[str]:
    """Those of ``paths`` that process ``pid`` has mapped (removed or not)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [path for path in paths if path in maps]


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shm"])
def test_a_forecast_of_a_server_that_restarted_meanwhile_is_not_sent_to_the_new_one(bad_runner: Path,
                                                                                    shm: bool) -> None:
    """The server dies and a new one comes up on the same addresses while the runner runs its model: the
    forecast belongs to the old server's task, whose id the new server may have given to another member. The
    runner notices the lost connection before it sends, greets the new server and serves it. Before it greets
    it, the runner has unmapped the old server's store and slots (their pages would stay pinned while the new
    server makes its own segments: with a large store, a full /dev/shm)."""
    old = ScriptedServer(TOKEN, [(1, 3, 1)], ranks=1, shm=shm)
    gate = threading.Event()
    new = None
    try:
        p = subprocess.Popen([str(bad_runner), old.address, TOKEN, "slow"], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "forecast"
        segments = [m.store for m in old.shm] + [path for m in old.shm for path in m.slots.values()]
        assert mapped(p.pid, segments) == segments and len(segments) == 2 * shm, segments
        old.close()
        new = ScriptedServer(TOKEN, [(1, 4, 1)], ranks=1, like=old, shm=shm, welcome_gate=gate)
        deadline = time.monotonic() + 20
        while ("HELLO", 0, -1) not in new.received:
            assert p.poll() is None and time.monotonic() < deadline, new.received
            time.sleep(0.02)
        greeting = mapped(p.pid, segments)
        gate.set()
        out = p.communicate(timeout=30)[0]
    finally:
        gate.set()
        old.close()
        if new is not None:
            new.close()
    assert p.returncode == 0, out
    assert greeting == [], greeting
    get, put = ("GET_SLOT", "PUT_SLOT") if shm else ("GET", "PUT")
    kinds = [(k, t) for k, t, _ in new.received]
    # The old task's PUT never reached the new server: its only PUT is of its own task 1 (member 4).
    assert kinds.count((put, 1)) == 1 and kinds.index((put, 1)) > kinds.index((get, 1)), kinds


@pytest.mark.parametrize("ranks", [1, 3], ids=["one-rank", "three-ranks"])
def test_a_task_whose_slot_the_server_retired_is_forgotten(bad_runner: Path, slices_runner: Path, ranks: int) -> None:
    """The server retires the slot of a task it declared stale (its runner was SIGSTOPped past the heartbeat
    timeout, say). Server rank 1 retires task 1's slot just before its SLOT reply names it (the runner finds
    no such file), and task 2's once the runner has written its forecast there (its PUT_SLOT is refused). Either
    way the runner forgets the task, as the server did, and serves the next one: no error, no FAIL. An MPI
    runner's ranks (slices_runner: 3 thread ranks, rank 2 alone talks to server rank 1) all forget it."""
    server = ScriptedServer(TOKEN, [(1, 3, 1), (2, 4, 1), (3, 5, 1)], shm=True,
                            retire={(1, 1): Retire.AT_GET, (2, 1): Retire.AT_PUT})
    p = run_to_end(bad_runner if ranks == 1 else slices_runner, server, "good" if ranks == 1 else str(ranks))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert server.fails == [], server.fails
    sent = {(k, t, rank) for k, t, rank in server.received if rank >= 0}
    assert {("GET_SLOT", 1, 1), ("PUT_SLOT", 2, 1), ("PUT_SLOT", 3, 0), ("PUT_SLOT", 3, 1)} <= sent, sent
    assert not {("PUT_SLOT", 1, 0), ("PUT_SLOT", 1, 1)} & sent, sent
    for rank in (0, 1):  # each runner rank's pieces of member 5's forecast (the last to come recorded)
        assert (np.frombuffer(server.forecasts[(3, rank)]) == 5.01).all(), server.forecasts


def _copy(where: dict, path: Path, made: list[Path]) -> dict:
    """``where`` naming as the slot a copy of it (header and all) at ``path``."""
    shutil.copyfile(where["write"], path)
    made.append(path)
    return {**where, "write": str(path)}


def _link(where: dict, path: Path, made: list[Path]) -> dict:
    """``where`` naming as the slot a link to it at ``path``."""
    path.symlink_to(where["write"])
    made.append(path)
    return {**where, "write": str(path)}


SEGMENT = f"enkflow-online-{os.getpid()}-5107c0de"  # a segment's name, of a live maker (not swept)


@pytest.mark.parametrize("spoil, said", [
    (lambda where, tmp, made: {**where, "at": [[a + 0.5, b] for a, b in where["at"]]},
     "its SLOT reply's offsets of field 'x' are not a pair of integers"),
    (lambda where, tmp, made: {**where, "at": [[a, b, 0] for a, b in where["at"]]},
     "its SLOT reply's offsets of field 'x' are not a pair of integers"),
    (lambda where, tmp, made: {**where, "at": where["at"] * 2}, "its SLOT reply lacks read, write or an offset pair"),
    (lambda where, tmp, made: _copy(where, tmp / SEGMENT, made), "not a segment of an enkflow server"),
    (lambda where, tmp, made: _copy(where, shm_dir() / f"{SEGMENT}.copy", made), "not a segment of an enkflow server"),
    (lambda where, tmp, made: _link(where, shm_dir() / SEGMENT, made),
     "cannot open it read-write: Too many levels of symbolic links"),
    (lambda where, tmp, made: {**where, "write": where["read"]}, "not an enkflow slot segment"),
], ids=["float-offsets", "three-offsets", "twice-the-pairs", "outside-the-segment-directory", "not-a-segment-name",
        "a-link", "the-store"])
def test_a_malformed_slot_reply_is_a_protocol_error_on_every_runner_rank(slices_runner: Path, tmp_path: Path,
                                                                         spoil: Callable, said: str) -> None:
    """A SLOT reply of server rank 1 (to runner rank 2 of 3, the only one talking to it) that places the
    pieces wrongly, or names as the task's slot a file that is not one of a server's segments (a copy of the
    slot elsewhere or under another name, a link to it, the store): ENKFLOW_EPROTOCOL on that rank, a refusal
    on the others (no rank hangs in a collective), the member given back once, nothing written anywhere."""
    made: list[Path] = []

    def spoil_slot(task: int, rank: int, where: dict) -> dict:
        return spoil(where, tmp_path, made) if (task, rank) == (1, 1) else where

    server = ScriptedServer(TOKEN, [(1, 3, 1), (2, 4, 1)], shm=True, spoil_slot=spoil_slot)
    try:
        p = run_to_end(slices_runner, server, "3", timeout=30)
        copies = [path.read_bytes() for path in made if not path.is_symlink()]
    finally:
        for path in made:
            path.unlink(missing_ok=True)
    errors = sorted(line for line in p.stderr.splitlines() if line.startswith("rank "))
    assert p.returncode != 0 and len(errors) == 3, p.stderr
    assert errors[2].startswith("rank 2: error 9: server rank 1: ") and said in errors[2], errors
    assert all(line.startswith(f"rank {k}: error 7: an error on another runner rank") for k, line in
               enumerate(errors[:2])), errors
    assert len(server.fails) == 1 and not any(k == "PUT_SLOT" for k, _, _ in server.received), server
    assert not any(np.frombuffer(data[4096:]).any() for data in copies)  # the runner wrote nothing there


def test_a_refusal_sent_just_before_the_server_went_is_read_not_taken_for_a_lost_server(bad_runner: Path) -> None:
    """The ERROR that stops a study leaves just before the server closes its sockets. By the time the runner
    reads that rank, the disconnect is already known: the queued ERROR must still be read first (it said the
    server went away, and the forecast's refusal was never reported)."""
    server = ScriptedServer(TOKEN, [(1, 3, 1)], put_delay={0: 0.5}, close_after_error=True,
                            put_reply=lambda task, rank: "element 0 is nan (NaN or Inf in the forecast)" if rank == 1
                            else None)
    p = run_to_end(bad_runner, server, "nan")
    lines = rc_lines(p)
    assert p.returncode == 0, (p.returncode, lines, p.stderr)
    assert len(lines) == 1 and "rc=7 refused by the server" in lines[0] and "element 0 is nan" in lines[0], lines
