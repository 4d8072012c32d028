"""Native runner faults are handled as the Python runner's (tests/online/test_online_faults.py): a C
runner killed with SIGKILL mid-forecast, one that crashes inside libenkflow_runner (SIGSEGV while it
writes the member it just received), one whose model calls abort() right after receiving a member, and
one that crashes copying its forecast into the task's slot in the server's shared memory (half written).
Each time the server notices the missing heartbeats, gives the member to another runner (one
``task_requeue``, reason ``lost``, for exactly that task), the supervisor replaces the dead runner, and
the study ends with exit 0, results bitwise equal to the Python model's offline run, and no shared memory
segment of its servers left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from demo_study import differences, make_forcing, online_study, outputs, start_study

FAST_FAULTS = "heartbeat = 0.2\nheartbeat_timeout = 1.0\ndue_floor = 10.0\n"



def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def _finish(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out
    return proc.returncode, out


def _wait_assignment(proc: subprocess.Popen, events: Path, cycle: int, member: int) -> dict:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        e = next((e for e in _events(events) if e.get("event") == "task_assign" and e.get("cycle") == cycle
                  and e.get("member") == member), None)
        if e is not None:
            return e
        time.sleep(0.01)
    raise AssertionError(f"member {member} of cycle {cycle} was never assigned")


@pytest.mark.parametrize("fault", ["signals", "crashes"])
def test_a_native_runner_fault_requeues_its_member_only(native_build, reference, tmp_path: Path, fault: str) -> None:
    """signals: SIGKILL mid-forecast (member 3 of cycle 2: requeued as ``lost``), then SIGTERM mid-forecast
    (member 5 of cycle 3: the runner leaves cleanly with a BYE, its member requeued at once as ``left``, as
    the Python runner's). crashes: a runner that crashes inside the library (SIGSEGV writing the first member
    it receives, in cycle 1), later one whose model calls abort() right after receiving a member of cycle 2,
    then one that crashes (SIGSEGV) half way through copying a forecast of cycle 3 into its slot (all
    ``lost``)."""
    exe = native_build.exe("enkflow_demo_c")
    forcing = tmp_path / "forcing.nc"
    markers = tmp_path / "crashed-in-library", tmp_path / "aborted", tmp_path / "crashed-in-put"
    extra = {"signals": "--sleep 0.5",
             "crashes": f"--crash-in-library {markers[0]} --abort-in-cycle 2 --marker {markers[1]} "
                        f"--crash-in-put 3 --put-marker {markers[2]}"}[fault]
    study = online_study(tmp_path / "study", f"{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                                             f"--forcing {forcing} --length {{length}} {extra}", online=FAST_FAULTS)
    make_forcing(study.directory / "members" / "member_0001.nc", forcing)
    events = study.run_dir / "events.jsonl"
    proc = start_study(study)
    victims = []
    if fault == "signals":
        for cycle, member, sig in ((2, 3, signal.SIGKILL), (3, 5, signal.SIGTERM)):
            victim = _wait_assignment(proc, events, cycle, member)
            time.sleep(max(0.0, float(victim["t"]) + 0.15 - time.time()))  # into its 0.5 s forecast
            os.kill(int(str(victim["runner"]).rsplit(":", 1)[1]), sig)
            victims.append(victim)
    rc, log = _finish(proc)
    assert rc == 0, f"enkflow run failed ({rc}):\n{log}\n{study.runner_logs()}"
    ev = _events(events)
    requeued = [e for e in ev if e.get("event") == "task_requeue"]
    if fault == "signals":
        assert [(e["cycle"], e["member"], e["task"], e["reason"]) for e in requeued] == [
            (2, 3, victims[0]["task"], "lost"), (3, 5, victims[1]["task"], "left")], (requeued, victims)
        assert sum(e.get("event") == "runner_leave" for e in ev) == 1, "the SIGTERMed runner left without a BYE"
    else:
        assert all(m.exists() for m in markers), "a fault was never injected"
        assert [(e["cycle"], e["reason"]) for e in requeued] == [(1, "lost"), (2, "lost"), (3, "lost")], requeued
    # Only the interrupted forecasts were run again: one assignment more per fault than the members x cycles
    # (plus the statelessness check's repeats, as many as in a fault-free run).
    assigned = [(e["cycle"], e["member"]) for e in ev if e.get("event") == "task_assign"]
    checks = sum(1 for e in ev if e.get("event") == "stateless_check")
    assert len(assigned) == 8 * 3 + checks + len(requeued), (len(assigned), checks)
    assert all(assigned.count((e["cycle"], e["member"])) >= 2 for e in requeued)
    assert sum(e.get("event") == "runner_exit" for e in ev) == len(requeued), "the dead runners were not replaced"
    bad = differences(reference, outputs(study.directory, study.run_dir))
    assert not bad, f"{fault}: not bitwise the offline run: {bad}"
    assert set(study.shm_ranks()) == {1} and not study.segments_left(), (study.shm_ranks(), study.segments_left())


def test_native_runners_greet_a_restarted_server(native_build, reference, tmp_path: Path) -> None:
    """The server killed with SIGKILL in cycle 2, after some of its forecasts: the supervisor restarts it from
    its checkpoints on the same port, the C runners (still running) notice the lost connection and greet the
    new server by themselves, and the study ends bitwise as the offline run."""
    exe = native_build.exe("enkflow_demo_c")
    forcing = tmp_path / "forcing.nc"
    study = online_study(tmp_path / "study", f"{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                                             f"--forcing {forcing} --length {{length}} --sleep 0.2", online=FAST_FAULTS)
    make_forcing(study.directory / "members" / "member_0001.nc", forcing)
    events = study.run_dir / "events.jsonl"
    proc = start_study(study)
    deadline = time.monotonic() + 90
    server_pid = None
    while time.monotonic() < deadline and proc.poll() is None:
        ev = _events(events)
        start = next((e for e in ev if e.get("event") == "online_start"), None)
        done2 = [e for e in ev if e.get("event") == "task_done" and e.get("cycle") == 2]
        if start is not None and len(done2) >= 3:
            server_pid = int(start["pid"])
            break
        time.sleep(0.01)
    assert server_pid is not None, "cycle 2 never got 3 forecasts"
    os.kill(server_pid, signal.SIGKILL)
    rc, log = _finish(proc)
    assert rc == 0, f"enkflow run failed ({rc}):\n{log}\n{study.runner_logs()}"
    ev = _events(events)
    assert sum(e.get("event") == "server_crash" for e in ev) == 1, [e for e in ev if "server" in e.get("event", "")]
    joins = [e for e in ev if e.get("event") == "runner_join"]
    starts = [e for e in ev if e.get("event") == "runner_start"]
    assert len(starts) == 2 and len(joins) >= 4, (starts, joins)  # the same two runner processes joined twice
    bad = differences(reference, outputs(study.directory, study.run_dir))
    assert not bad, f"not bitwise the offline run after a server restart: {bad}"
    assert set(study.shm_ranks()) == {1} and not study.segments_left(), (study.shm_ranks(), study.segments_left())
