"""A server rank lost mid-forecast: the server stops, the launcher restarts it from its checkpoints,
and the study ends bitwise equal to the fault-free run with only the forecasts in flight redone.

``rank-kill`` SIGKILLs the server's rank 1 (mpiexec ends rank 0); ``rank-stop`` SIGSTOPs it, as a
node gone without closing its connections: rank 0 hears no heartbeat on the ranks' bus for
``[online] rank_timeout`` and stops the server itself (exit 75), and mpiexec ends the stopped rank.
"""

from __future__ import annotations

import json
import random

import pytest

from enkflow_testing.online_faults import OnlineFaultHarness, format_table

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> OnlineFaultHarness:
    h = OnlineFaultHarness(tmp_path_factory.mktemp("online-rank-loss"), members=8, cycles=2, runners=3, sleep=0.3,
                           heartbeat=0.2, heartbeat_timeout=1.0, due_floor=5.0, ranks=2, rank_timeout=3.0,
                           run_timeout=120.0)
    h.reference()
    return h


# A killed rank is what mpiexec itself notices (and benchmarks/node_loss_trials.py kills whole nodes); a
# stopped rank, a node gone without closing its connections, is what only the bus heartbeats find.
@pytest.mark.parametrize("scenario", ["rank-stop"])
def test_a_lost_server_rank_restarts_the_server_bitwise(harness: OnlineFaultHarness, scenario: str) -> None:
    res = harness.trial(1, scenario, random.Random(11), cycle=2)
    print(format_table([res]))
    assert res.injected, res.detail
    assert res.rc == 0 and res.outcome == "equal", res.detail
    assert res.server_restarts == 1, res.row()
    assert res.recompute_ok and res.redone_checkpointed == [], res.row()
    events = [json.loads(line) for line in (harness.run_dir / "events.jsonl").read_text().splitlines()]
    lost = [e for e in events if e.get("event") == "server_rank_lost"]
    if scenario == "rank-stop":  # noticed on the bus, not by mpiexec
        assert [e["ranks"] for e in lost] == [[1]], lost
