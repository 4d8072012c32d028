"""Fault injection into the real built-in analysis task: every kill ends bitwise equal.

A short version of ``benchmarks/fault_trials.py`` (which kills the analysis at every call of the
write/rename/unlink/fsync family of one cycle and at >= 20 random moments). Here: strace
SIGKILLs the analysis task (first attempt only; the job scheme retries it) on entering

* the replacement of a member restart by its shadow file after the update's commit (with the
  write-ahead log: a member restart write after the commit),
* the removal of the commit marker,
* a write of the analysis mean file,
* its last call of the family before it exits,

and the whole process tree (driver, pilots, models, analysis) is killed twice at random moments
and the experiment resumed. Every trial must end with restarts bitwise equal to the fault-free
run's. The kill points are chosen from a traced fault-free run, so they follow the code.

``ENKFLOW_FAULT_SRC=DIR`` runs the experiments with another ``src/`` (e.g. a worktree of an older
commit) to see these tests fail there; ``ENKFLOW_FAULT_SEED`` changes the random kills.
"""

from __future__ import annotations

import os
import random
import re

import pytest

from enkflow_testing import faults

pytestmark = pytest.mark.slow

WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> faults.FaultHarness:
    reason = faults.strace_missing_reason(install=True)
    if reason:
        pytest.skip(reason)
    env = dict(os.environ)
    if os.environ.get("ENKFLOW_FAULT_SRC"):
        env["PYTHONPATH"] = os.environ["ENKFLOW_FAULT_SRC"]
    h = faults.FaultHarness(tmp_path_factory.mktemp("faults"), members=4, cycles=1, workers=2, env=env,
                            run_timeout=120.0)
    h.reference()
    return h


@pytest.fixture(scope="module")
def traced(harness: faults.FaultHarness) -> tuple[faults.Trace, list[faults.Injection]]:
    tr = harness.trace(1)
    return tr, faults.plan_injections(tr)


def _choose(tr: faults.Trace, point: str) -> faults.Call:
    """The call of the count run at which ``point`` kills."""
    calls = tr.calls
    commits = [c for c in calls if c.name.startswith("rename") and re.search(r"-> members/\.enkflow-update-<key>\.json #", c.desc)]
    assert commits, "the traced analysis never committed its update:\n" + "\n".join(c.desc for c in calls)
    commit = commits[0].index
    if point == "member replaced after commit":
        # Shadow files: the second member's replacement (the first is replaced already); the log: a member write.
        member = [c for c in calls[commit + 1:] if any(re.search(r"/members/member_\d+\.nc$", p) for p in c.paths)]
        links = [c for c in member if c.name in ("link", "linkat")]
        found = links[1:] if links else [c for c in member if c.name in WRITES]
    elif point == "marker unlink":
        found = [c for c in calls if c.name.startswith("unlink") and c.desc.startswith("unlink members/.enkflow-update-<key>.json #")]
    elif point == "diagnostics write":
        # The analysis's own output file (its statistics, and the mean and spread files made from them,
        # are written by the output service and the driver).
        found = [c for c in calls if c.name in WRITES and "obs_diag.nc" in c.desc]
        found = found[len(found) // 2:]
    elif point == "last call before exit":
        found = [c for c in calls if c.tid == tr.pid][-1:]
    else:
        raise ValueError(point)
    assert found, f"no call for {point!r} in the traced analysis:\n" + "\n".join(c.desc for c in calls)
    return found[0]


@pytest.mark.parametrize("point", ["member replaced after commit", "marker unlink", "diagnostics write", "last call before exit"])
def test_kill_analysis_at_syscall(harness: faults.FaultHarness, traced, point: str) -> None:
    tr, plan = traced
    target = _choose(tr, point)
    inj = plan[target.index]
    assert inj.exact, f"strace's counting cannot single out {target.desc}: {inj.spec} kills {inj.expected}"
    r = harness.syscall_trial(target.index, inj, 1)
    info = f"{point}: {inj.spec}; hit {r.hit}; analysis attempts {r.attempts}; omb_rms as in the reference: {r.omb_ok}"
    assert r.exact, f"the kill did not land on the planned call ({info})"
    assert r.attempts.get(1, 0) >= 2, f"the analysis was not retried ({info})"
    assert r.outcome == "equal", f"{r.outcome}: {r.detail} ({info})"
    assert " left" not in r.detail, f"{r.detail} ({info})"  # no process, log, shadow or spare outlives the study


@pytest.mark.parametrize("moment", ["time", "analysis"])
def test_kill_process_tree_and_resume(harness: faults.FaultHarness, moment: str) -> None:
    seed = int(os.environ.get("ENKFLOW_FAULT_SEED", "7")) + (moment == "analysis")
    r = harness.kill_trial(900 + (moment == "analysis"), "tree", moment, random.Random(seed), cycle=1)
    info = f"{r.where}; {r.hit}; enkflow runs {r.runs}; analysis attempts {r.attempts}; omb_rms ok: {r.omb_ok}"
    assert "processes killed" in r.hit, info
    assert r.outcome == "equal", f"{r.outcome}: {r.detail} ({info})"
    assert " left" not in r.detail, f"{r.detail} ({info})"  # no process, log, shadow or spare outlives the study


def test_trace_parser_counts_per_thread() -> None:
    """strace's rule as the planner models it: when=N counts per thread (and per -P path)."""
    log = "\n".join([
        '10 execve("/py", ["/py"], 0x1 /* 1 vars */) = 0',
        '10 pwrite64(3</w/a.log>, "h", 1, 0) = 1',
        '11 pwrite64(4</w/m1.nc>, "x", 1, 0 <unfinished ...>',
        '10 rename("/w/t.tmp10", "/w/t") = 0',
        '11 <... pwrite64 resumed>) = 1',
        '12 pwrite64(5</w/m2.nc>, "x", 1, 0) = ?',
        '12 +++ killed by SIGKILL +++',
    ])
    tr = faults.parse_strace(log, 10)
    tr.calls = faults.describe_calls(tr.calls, root="/w", pid=10, key=None)
    assert [c.desc for c in tr.calls] == ["pwrite64 a.log #1", "pwrite64 m1.nc #1", "rename t.tmp<pid> -> t #1",
                                         "pwrite64 m2.nc #1"]
    assert [c.desc for c in tr.hits()] == ["pwrite64 m2.nc #1"]
    # when=1 by name alone kills thread 10's first pwrite64, never thread 11's: -P is needed.
    assert faults.predict(tr.calls, "pwrite64", None, 1)[0].desc == "pwrite64 a.log #1"
    plan = faults.plan_injections(tr)
    assert all(p.exact for p in plan)
    assert (plan[1].path, plan[1].when) == ("/w/m1.nc", 1)
    assert plan[2].path == "/w/t.tmp%PID%"
    # -P never selects a rename by its new name (strace 6.1): /w/t does not count it.
    assert faults.predict(tr.calls, "rename", "/w/t", 1) == []
