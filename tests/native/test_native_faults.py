"""Native runner faults are handled as the Python runner's (tests/online/test_online_faults.py): a C
runner killed with SIGKILL mid-forecast, one that crashes inside libenkflow_runner (SIGSEGV while it
writes the member it just received), and one whose model calls abort() right after receiving a member.
Each time the server notices the missing heartbeats, gives the member to another runner (one
``task_requeue``, reason ``lost``, for exactly that task), the supervisor replaces the dead runner, and
the study ends with exit 0 and results bitwise equal to the Python model's offline run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from demo_study import differences, make_forcing, offline_reference, online_study, outputs, start_study

FAST_FAULTS = "heartbeat = 0.2\nheartbeat_timeout = 1.0\ndue_floor = 10.0\n"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = offline_reference(tmp_path_factory.mktemp("offline"))
    return outputs(d, d / "run")


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


@pytest.mark.parametrize("fault", ["kill-9", "crash-in-library", "abort"])
def test_a_native_runner_fault_requeues_its_member_only(native_build, reference, tmp_path: Path, fault: str) -> None:
    exe = native_build.exe("enkflow_demo_c")
    forcing = tmp_path / "forcing.nc"
    marker = tmp_path / "fault-injected"
    extra = {"kill-9": "--sleep 0.3", "crash-in-library": f"--crash-in-library {marker}",
             "abort": f"--abort-in-cycle 2 --marker {marker}"}[fault]
    study = online_study(tmp_path / "study", f"{exe} --address {{address}} --token-file {{token_file}} --grid {{restart}} "
                                             f"--forcing {forcing} --length {{length}} {extra}", online=FAST_FAULTS)
    make_forcing(study.directory / "members" / "member_0001.nc", forcing)
    events = study.run_dir / "events.jsonl"
    proc = start_study(study)
    victim = None
    if fault == "kill-9":
        deadline = time.monotonic() + 90
        while victim is None and time.monotonic() < deadline and proc.poll() is None:
            victim = next((e for e in _events(events) if e.get("event") == "task_assign" and e.get("cycle") == 2
                           and e.get("member") == 3), None)
            time.sleep(0.01)
        assert victim is not None, "member 3 of cycle 2 was never assigned"
        time.sleep(0.1)  # into its 0.3 s forecast
        os.kill(int(str(victim["runner"]).rsplit(":", 1)[1]), signal.SIGKILL)
    rc, log = _finish(proc)
    assert rc == 0, f"enkflow run failed ({rc}):\n{log}\n{study.runner_logs()}"
    if fault != "kill-9":
        assert marker.exists(), "the fault was never injected"
    ev = _events(events)
    requeues = [e for e in ev if e.get("event") == "task_requeue"]
    assert [e["reason"] for e in requeues] == ["lost"], requeues
    lost = requeues[0]
    if fault == "kill-9":
        assert (lost["cycle"], lost["member"], lost["task"]) == (2, 3, victim["task"]), (lost, victim)
    if fault == "abort":
        assert lost["cycle"] == 2, lost
    # Only the interrupted forecast was run again: one assignment more than the members x cycles (plus the
    # statelessness check's repeats, as many as in a fault-free run).
    assigned = [(e["cycle"], e["member"]) for e in ev if e.get("event") == "task_assign"]
    checks = sum(1 for e in ev if e.get("event") == "stateless_check")
    assert len(assigned) == 8 * 3 + checks + 1, (len(assigned), checks)
    assert assigned.count((lost["cycle"], lost["member"])) >= 2
    assert any(e.get("event") == "runner_exit" for e in ev), "the dead runner was not replaced"
    bad = differences(reference, outputs(study.directory, study.run_dir))
    assert not bad, f"{fault}: not bitwise the offline run: {bad}"
