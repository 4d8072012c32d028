"""The to-do list: order, analysis gating, requeue at the front, failures, concurrent claims."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from enkflow.jobs.files import hostname
from enkflow.jobs.todo import Claimant, Take, TodoList, remaining


def me(name: str = "w") -> Claimant:
    return Claimant(worker=name, host=hostname(), pid=os.getpid(), pid_ctime=0.0, job="")


def test_members_in_order_then_analysis_only_when_all_done(tmp_path: Path) -> None:
    todo = TodoList.create(tmp_path, 3)
    assert [todo.claim(me()) for _ in range(3)] == [1, 2, 3]
    # The analysis (ID 4) waits while members are running.
    assert todo.claim(me()) is Take.WAIT
    todo.complete(1, me())
    todo.complete(2, me())
    assert todo.claim(me()) is Take.WAIT
    todo.complete(3, me())
    assert todo.claim(me()) == 4
    assert todo.claim(me()) is Take.EMPTY
    todo.complete(4, me())
    assert remaining(todo.snapshot()) == []


def test_requeue_goes_to_the_front_and_create_keeps_existing_list(tmp_path: Path) -> None:
    todo = TodoList.create(tmp_path, 4)
    assert todo.claim(me()) == 1
    assert todo.claim(me()) == 2
    todo.requeue(2, reason="time-limit")
    assert todo.snapshot()["pending"][0] == 2
    # Resume: creating again keeps the recorded state.
    again = TodoList.create(tmp_path, 4)
    assert again.claim(me()) == 2
    assert again.snapshot()["requeues"] == {"2": 1}


def test_failures_requeue_until_max_attempts_then_abort(tmp_path: Path) -> None:
    todo = TodoList.create(tmp_path, 2)
    assert todo.claim(me()) == 1
    assert todo.fail(1, max_attempts=2, report={"returncode": 1}) is False
    assert todo.claim(me()) == 1  # retried first
    assert todo.fail(1, max_attempts=2, report={"returncode": 1, "stderr_tail": "boom"}) is True
    assert todo.claim(me()) is Take.ABORT
    assert todo.snapshot()["failed"]["1"]["stderr_tail"] == "boom"


def test_only_restricts_to_one_task(tmp_path: Path) -> None:
    todo = TodoList.create(tmp_path, 3)
    assert todo.claim(me(), only=2) == 2
    assert todo.claim(me(), only=2) is Take.EMPTY  # someone holds it
    assert todo.claim(me(), only=4) is Take.WAIT  # analysis not yet allowed
    assert todo.claim(me()) == 1


def test_stale_claims_are_requeued_at_the_front(tmp_path: Path) -> None:
    todo = TodoList.create(tmp_path, 4)
    for name in ("a", "b", "c"):
        todo.claim(me(name))
    stale = todo.requeue_stale(lambda c: c["worker"] in ("a", "c"))
    assert sorted(t for t, _ in stale) == [1, 3]
    assert todo.snapshot()["pending"][:3] == [1, 3, 4]


def _claimer(directory: str, out: "mp.Queue[list[int]]") -> None:
    todo = TodoList(directory)
    who = Claimant(worker=f"p{os.getpid()}", host=hostname(), pid=os.getpid(), pid_ctime=0.0, job="")
    got = []
    while True:
        t = todo.claim(who)
        if t is Take.EMPTY:
            break
        if t is Take.WAIT:
            time.sleep(0.001)
            continue
        got.append(t)
        todo.complete(t, who)
    out.put(got)


def test_concurrent_processes_never_take_an_id_twice(tmp_path: Path) -> None:
    n = 120
    TodoList.create(tmp_path, n)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(str(tmp_path), q)) for _ in range(4)]
    for p in procs:
        p.start()
    taken = [t for _ in procs for t in q.get(timeout=60)]
    for p in procs:
        p.join(timeout=30)
    assert sorted(taken) == list(range(1, n + 2))
    assert taken.count(n + 1) == 1


@pytest.mark.parametrize("seconds, expect", [(30, "0:01:00"), (60, "0:01:00"), (61, "0:02:00"), (7200, "2:00:00")])
def test_slurm_time_rounds_up_to_minutes(seconds: float, expect: str) -> None:
    from enkflow.jobs.slurm import slurm_time

    assert slurm_time(seconds) == expect
