"""Fault tests: kill -9 of a member's model, a pilot worker and the analysis at random moments,
and of the analysis once more right after it has rewritten its first restart (so that its rerun
finds some members analysed and some not).

Each cycle must complete, no member may run twice to completion (exactly one
``task_end`` per cycle and task), and the restarts must equal those of a
fault-free run bit for bit. The analysis (``jobs_helpers/toy_analysis.py``)
nudges the restarts toward every observation of the cycle, so an observation
lost or applied twice by a rerun changes the bits.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.shm_names import shm_dir
from jobs_helpers.experiments import make_experiment, restarts

N = 4


def _find(kind: str, root: Path) -> list[psutil.Process]:
    """This test's processes of one kind (matched on their command line, under ``root`` only)."""
    marker = {"model": "enkflow.cli.model", "worker": "-m enkflow.jobs ", "analysis": "toy_analysis.py",
              "analysis-writing": "toy_analysis.py"}[kind]
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and str(root) in cmd:
            found.append(p)
    return found


def _restart_ids(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_ino for p in sorted((root / "members").glob("member_*.nc"))}


class Killer(threading.Thread):
    """Kills one process of each planned kind at a random moment of its life; an
    ``analysis-writing`` one as soon as it has replaced a restart (its first one, usually)."""

    def __init__(self, root: Path, plan: list[str], seed: int):
        super().__init__(daemon=True)
        self.root, self.plan, self.rng = root, plan, random.Random(seed)
        self.killed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for kind in self.plan:
            deadline = time.time() + 30
            while not self.stop.is_set() and time.time() < deadline:
                procs = _find(kind, self.root)
                if procs:
                    victim = self.rng.choice(procs)
                    if kind == "analysis-writing":
                        if not self._wait_for_a_restart_write(victim):
                            continue
                    else:
                        time.sleep(self.rng.uniform(0.0, 0.25))
                    try:
                        victim.send_signal(signal.SIGKILL)
                        self.killed.append(kind)
                    except psutil.NoSuchProcess:
                        continue
                    break
                time.sleep(0.01)
            time.sleep(self.rng.uniform(0.1, 0.6))

    def _wait_for_a_restart_write(self, proc: psutil.Process) -> bool:
        """Whether a restart was replaced (new inode) while ``proc`` still ran."""
        before = _restart_ids(self.root)
        try:
            while not self.stop.is_set() and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                if _restart_ids(self.root) != before:
                    return True
                time.sleep(0.002)
        except psutil.NoSuchProcess:
            pass
        return False


def _run(root: Path, synth: Path, plan: list[str] | None, seed: int = 0) -> tuple[list[np.ndarray], list[str], Path]:
    cfg = load_experiment(make_experiment(root, synth, model_sleep=0.3, analysis_sleep=0.6, max_attempts=5))
    killer = Killer(root, plan or [], seed)
    if plan:
        killer.start()
    try:
        Experiment(cfg).run()
    finally:
        killer.stop.set()
    if plan:
        killer.join(timeout=5)
    return restarts(root, N), killer.killed, cfg.expdir


@pytest.mark.slow
def test_kill9_model_worker_and_analysis(tmp_path: Path, synth: Path) -> None:
    ref, _, _ = _run(tmp_path / "ref", synth, None)
    plan = ["model", "worker", "analysis-writing", "worker", "model", "analysis"]
    got, killed, expdir = _run(tmp_path / "faulty", synth, plan, seed=int(os.environ.get("ENKFLOW_FAULT_SEED", "7")))
    assert {"model", "worker", "analysis-writing", "analysis"} <= set(killed), killed
    for m, (a, b) in enumerate(zip(got, ref), start=1):
        assert np.array_equal(a, b), f"member {m} differs from the fault-free run"
    ends: dict[tuple[int, int], int] = {}
    fails = requeues = 0
    for e in iter_events(expdir / "events.jsonl"):
        if e["event"] == "task_end":
            ends[(e["cycle"], e["task"])] = ends.get((e["cycle"], e["task"]), 0) + 1
        fails += e["event"] == "task_fail"
        requeues += e["event"] == "task_requeue"
    assert ends == {(k, t): 1 for k in (1, 2, 3) for t in range(1, N + 2)}
    assert fails >= 1 and requeues >= 1


def test_sigterm_requeues_the_running_member_at_the_front(tmp_path: Path, synth: Path) -> None:
    """A worker told to stop (SLURM's SIGTERM before the time limit) puts its member back first, and
    removes the shared-memory names its node's dead processes left."""
    import subprocess
    import sys

    from enkflow.experiment.driver import build_tasks
    from enkflow.jobs.todo import TodoList

    cfg = load_experiment(make_experiment(tmp_path, synth, model_sleep=5.0, cycles=1))
    cdir = cfg.cycle_dir(1)
    cdir.mkdir(parents=True)
    (cfg.expdir / "config.json").write_text("{}")
    build_tasks(cfg, 1, cfg.expdir / "events.jsonl").write(cdir)
    todo = TodoList.create(cdir, N)
    w = subprocess.Popen([sys.executable, "-m", "enkflow.jobs", str(cdir)])
    deadline = time.time() + 20
    while not todo.snapshot()["claims"] and time.time() < deadline:
        time.sleep(0.05)
    assert todo.snapshot()["claims"].keys() == {"1"}
    # What a step killed at once (its process tree) leaves on the node: the stopping pilot removes it.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = shm_dir() / f"enkflow-output-beat-{int(dead.stdout)}-0123abcd"
    left.write_bytes(b"")
    time.sleep(0.5)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 0
    assert not left.exists(), "the pilot left a dead step's shared-memory name on its node"
    snap = todo.snapshot()
    assert snap["pending"][0] == 1 and not snap["claims"] and not snap["done"]
    reasons = [e.get("reason") for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "task_requeue"]
    assert reasons == ["sigterm"]
    assert not _find("model", tmp_path)


@pytest.mark.parametrize("pilots, reason", [("cycle", "time-limit"), ("study", "time-ahead")])
def test_time_limit_requeues_and_a_new_pilot_finishes(tmp_path: Path, synth: Path, pilots: str, reason: str) -> None:
    """Pilots with a 2.5 s limit cannot finish a 1.5 s member after their first one: requeue, resubmit, done.
    A pilot of one cycle is stopped at its limit inside the member; one that spans cycles knows
    how long a member takes and puts the member back before it starts it."""
    cfg = load_experiment(make_experiment(tmp_path, synth, model_sleep=1.5, cycles=1, workers=2, time_limit=2.5,
                                          pilots=pilots))
    Experiment(cfg).run()
    ev = list(iter_events(cfg.expdir / "events.jsonl"))
    assert any(e["event"] == "task_requeue" and e.get("reason") == reason for e in ev)
    if pilots == "study":  # no member was cut short once its pilot knew how long one takes (its first may be)
        ended: set[str] = set()
        for e in ev:
            if e["event"] == "task_end":
                ended.add(e["worker"])
            elif e["event"] == "task_requeue" and e.get("reason") == "time-limit":
                assert e["worker"] not in ended, e
    assert sum(e["event"] == "job_submit" for e in ev) > 2
    ends = [(e["cycle"], e["task"]) for e in ev if e["event"] == "task_end"]
    assert sorted(ends) == [(1, t) for t in range(1, N + 2)]
