"""Pilots that span cycles (``[jobs] pilots = "study"``, :mod:`enkflow.jobs.pilot`): the same
restarts as pilots of one cycle, one queue wait per pilot rather than per cycle, the idle wait
as its own term, and the study's end or a killed pilot leaving nothing behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.report import load_report, render_report
from jobs_helpers.experiments import make_experiment, restarts

N = 4


def _events(cfg) -> list[dict]:
    return list(iter_events(cfg.expdir / "events.jsonl"))


def _pilot_processes(board: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "--board" in cmd and str(board) in cmd:
            out.append(p)
    return out


@pytest.fixture(scope="module")
def per_cycle(tmp_path_factory: pytest.TempPathFactory, synth: Path) -> list[np.ndarray]:
    root = tmp_path_factory.mktemp("per_cycle")
    Experiment(load_experiment(make_experiment(root, synth, cycles=3, pilots="cycle"))).run()
    return restarts(root, N)


def test_the_same_pilots_work_every_cycle_and_the_restarts_are_those_of_pilots_of_one_cycle(
        tmp_path: Path, synth: Path, per_cycle: list[np.ndarray]) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=3, workers=2, analysis_sleep=0.5))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path, N), per_cycle):
        assert np.array_equal(a, b)
    ev = _events(cfg)
    starts = [e for e in ev if e["event"] == "job_start"]
    assert len(starts) == 2 and all(e.get("span") == "study" for e in starts)  # submitted once, for the study
    jobs = {e["job"] for e in starts}
    for k in (2, 3):  # every later cycle's tasks ran in those pilots
        assert {e["job"] for e in ev if e["event"] == "task_start" and e["cycle"] == k} <= jobs
    waits = [e for e in ev if e["event"] == "pilot_wait" and e["joined"]]
    assert {e["cycle"] for e in waits} >= {2, 3} and all(e["idle_s"] >= 0 for e in waits)
    ends = [e for e in ev if e["event"] == "job_end"]
    assert {e["job"] for e in ends} == jobs and all(e["reason"] == "study-end" for e in ends)
    assert _pilot_processes(cfg.dir.board) == []
    rep = load_report(cfg.expdir)
    assert [c.cycle for c in rep.cycles] == [1, 2, 3]
    # The analysis ran inside a pilot while the other waited: the wait is its own term, not queuing.
    assert all(c.pilot_idle > 0.3 for c in rep.cycles[1:])
    text = render_report(rep)
    assert "p.idle" in text and "pilots idle between cycles" in text
    for c in rep.cycles[1:]:
        assert c.queuing < 0.2 * c.total and abs(c.queuing + c.running + c.io + c.overhead - c.total) < 1e-6


def test_a_pilot_idle_longer_than_its_timeout_leaves_and_the_next_cycle_gets_new_ones(
        tmp_path: Path, synth: Path, per_cycle: list[np.ndarray]) -> None:
    # An idle timeout shorter than the analysis: the pilot that does not run it leaves.
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=3, workers=2, analysis_sleep=1.5,
                                          jobs_extra="idle_timeout = 0.5"))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path, N), per_cycle):
        assert np.array_equal(a, b)
    ev = _events(cfg)
    idle = [e for e in ev if e["event"] == "job_end" and e["reason"] == "idle"]
    assert idle
    assert any(e["event"] == "pilot_wait" and not e["joined"] for e in ev)
    assert sum(e["event"] == "job_submit" for e in ev) > 2  # replaced for the later cycles
    assert _pilot_processes(cfg.dir.board) == []


def test_a_pilot_killed_while_waiting_between_cycles_is_replaced_and_the_study_is_bitwise(
        tmp_path: Path, synth: Path, per_cycle: list[np.ndarray]) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=3, workers=2, analysis_sleep=2.0))
    killed: list[int] = []

    def kill_a_waiting_pilot() -> None:
        events = cfg.expdir / "events.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and not killed:
            ev = list(iter_events(events)) if events.exists() else []
            ana = [e for e in ev if e["event"] == "task_start" and e.get("cycle") == 1 and e.get("member") is None]
            if ana:
                busy = ana[0]["worker"]
                for p in _pilot_processes(cfg.dir.board):
                    if not busy.endswith(f"-{p.pid}"):
                        os.kill(p.pid, signal.SIGKILL)
                        killed.append(p.pid)
                        return
            time.sleep(0.05)

    t = threading.Thread(target=kill_a_waiting_pilot)
    t.start()
    Experiment(cfg).run()
    t.join()
    assert killed
    for a, b in zip(restarts(tmp_path, N), per_cycle):
        assert np.array_equal(a, b)
    ev = _events(cfg)
    assert all(n == 1 for n in _task_end_counts(ev).values())
    assert sum(e["event"] == "job_submit" for e in ev) >= 3
    assert _pilot_processes(cfg.dir.board) == []


def _task_end_counts(ev: list[dict]) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for e in ev:
        if e["event"] == "task_end":
            counts[(e["cycle"], e["task"])] = counts.get((e["cycle"], e["task"]), 0) + 1
    return counts


@pytest.mark.parametrize("pilots", ["study", "cycle"])
def test_a_parallel_analysis_runs_only_in_a_pilot_that_holds_its_cpus(tmp_path: Path, synth: Path, pilots: str,
                                                                       per_cycle: list[np.ndarray]) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=3, workers=3, pilots=pilots,
                                          jobs_extra="analysis_cpus = 2"))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path, N), per_cycle):
        assert np.array_equal(a, b)
    ev = _events(cfg)
    cpus = {e["job"]: e["cpus"] for e in ev if e["event"] == "job_submit"}
    threads = {e["job"]: e["threads"] for e in ev if e["event"] == "job_start"}
    ana = [e for e in ev if e["event"] == "task_start" and e.get("member") is None]
    assert len(ana) == 3 and all(cpus[e["job"]] == 2 and threads[e["job"]] == 2 for e in ana)
    # The large pilot, submitted first, counts as two of the three workers: one small one beside it.
    first = [e["cpus"] for e in ev if e["event"] == "job_submit" and e["cycle"] == 1]
    assert first[:2] == [2, 1], first
    if pilots == "study":  # the next cycles' pilots were kept, not cancelled and submitted again
        assert not any(e["event"] == "job_cancel" and e.get("reason") == "unneeded" and e["cycle"] < 3 for e in ev)
    members_in_large = [e for e in ev if e["event"] == "task_start" and e.get("member") and cpus[e["job"]] == 2]
    assert members_in_large  # it ran members too while the analysis was not due
