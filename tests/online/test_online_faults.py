"""Online fault trials, the short version (acceptance criterion 4): one trial per scenario.

Each trial runs the online demo experiment (``enkflow run``: the supervisor, the server, three
demo runners idling 0.3 s per forecast) and injects one fault at a chosen moment: a runner
killed or stopped mid-forecast, the server killed before any forecast of the cycle was
checkpointed, after some were, or inside the analysis (strace kills it on entering a system
call), a runner joining while another leaves on SIGTERM. Every trial must end with exit status 0,
results bitwise equal to the fault-free run (final member restarts, every cycle's analysis mean
and spread), and only the interrupted forecasts redone; for a server kill no forecast that was
checkpointed before the kill may be assigned again. ``benchmarks/online_fault_trials.py`` runs
the randomized version (testing/enkflow_testing/online_faults.py has the details).
"""

from __future__ import annotations

import random

import pytest

from enkflow_testing.faults import strace_missing_reason
from enkflow_testing.online_faults import OnlineFaultHarness, format_table

pytestmark = pytest.mark.slow

CYCLES = 2


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> OnlineFaultHarness:
    h = OnlineFaultHarness(tmp_path_factory.mktemp("online-faults"), members=8, cycles=CYCLES, runners=3, sleep=0.3,
                           heartbeat=0.2, heartbeat_timeout=1.0, due_floor=5.0, run_timeout=90.0)
    h.reference()
    return h


def _check(res) -> None:
    print(format_table([res]))
    assert res.injected, res.detail
    assert res.rc == 0, res.detail
    assert res.outcome == "equal", res.detail
    assert res.recompute_ok, f"{res.recomputed} forecasts redone, {res.expected} were interrupted: {res.row()}"
    assert not res.segments_left, f"shared-memory segments left in /dev/shm: {res.segments_left}"


@pytest.mark.parametrize("scenario, kw", [
    ("runner-kill", {"cycle": 2}),
    ("runner-stop", {"cycle": 1, "variant": "cont"}),
    ("join-leave", {"cycle": 1}),
])
def test_runner_faults(harness: OnlineFaultHarness, scenario: str, kw: dict) -> None:
    res = harness.trial(1, scenario, random.Random(7), **kw)
    _check(res)
    # The victim held one member mid-forecast: that forecast, and nothing else, was run again.
    assert res.in_flight == 1 and res.recomputed == 1, res.row()
    if scenario == "join-leave":
        assert res.clean_leave and res.requeues.get("left") == 1, res.row()
    else:
        assert res.requeues.get("lost") == 1, res.row()


@pytest.mark.parametrize("scenario, kw", [
    ("server-before-ckpt", {"cycle": 2}),
    ("server-after-ckpt", {"cycle": 1}),
])
def test_server_kill_in_propagation(harness: OnlineFaultHarness, scenario: str, kw: dict) -> None:
    res = harness.trial(1, scenario, random.Random(3), **kw)
    _check(res)
    assert res.server_restarts == 1, res.row()
    assert len(res.addresses) == 1, res.row()  # the restart listens where the runners look for it
    assert res.redone_checkpointed == [], res.row()  # checkpointed before the kill: not recomputed
    if scenario == "server-before-ckpt":
        assert res.checkpointed == 0 and res.recovered == 0, res.row()
    else:
        assert res.checkpointed >= 1 and res.recovered == res.checkpointed, res.row()
    assert res.recomputed >= 1, res.row()  # the kill interrupted forecasts in flight


def test_server_kill_in_analysis(harness: OnlineFaultHarness) -> None:
    why = strace_missing_reason(install=False)
    if why:
        pytest.skip(why)
    # Between the analysis and its checkpoint: the mean and spread were being handed to their files'
    # writer (a restarted server must not skip the cycle: its checkpoint does not exist yet).
    res = harness.trial(1, "server-analysis", random.Random(5), cycle=CYCLES, point="rows-write")
    _check(res)
    assert res.server_restarts == 1 and res.recomputed == 0 and res.redone_checkpointed == [], res.row()
    assert res.recovered == 8, res.row()  # every forecast of the cycle came back from its checkpoint
