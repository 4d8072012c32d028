"""The SLURM launcher against a real one-node SLURM started by the test (``enkflow_testing.localslurm``).

Installs ``slurmctld slurmd slurm-client munge`` with apt-get when they are
absent (root only) and skips, with the reason, where that is impossible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.report import load_report
from enkflow_testing.localslurm import BackgroundLoad, LocalSlurm
from jobs_helpers.experiments import make_experiment, restarts

pytestmark = pytest.mark.slurm
N = 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, synth: Path) -> list[np.ndarray]:
    root = tmp_path_factory.mktemp("ref")
    Experiment(load_experiment(make_experiment(root, synth, cycles=2, model_sleep=0.0))).run()
    return restarts(root, N)


@pytest.mark.parametrize("strategy", ["dynamic", "per-member", "single"])
def test_strategies_on_slurm(slurm: LocalSlurm, tmp_path: Path, synth: Path, reference: list[np.ndarray], strategy: str) -> None:
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=2, model_sleep=0.0, strategy=strategy,
                                          launcher="slurm", workers=2))
    Experiment(cfg).run()
    for a, b in zip(restarts(tmp_path, N), reference):
        assert np.array_equal(a, b)
    ev = list(iter_events(cfg.expdir / "events.jsonl"))
    submitted = {e["job"] for e in ev if e["event"] == "job_submit"}
    started = {e["job"] for e in ev if e["event"] == "job_start"}
    assert submitted and all(j.isdigit() for j in submitted)  # real SLURM job IDs
    assert started <= submitted
    rep = load_report(cfg.expdir)
    assert len(rep.cycles) == 2 and all(c.total > 0 for c in rep.cycles)


def test_queued_pilots_are_cancelled_when_the_analysis_is_done(slurm: LocalSlurm, tmp_path: Path, synth: Path) -> None:
    """Load fills the node; of 4 pilots some are still queued when 1 running pilot finishes the cycle."""
    cfg = load_experiment(make_experiment(tmp_path, synth, cycles=1, model_sleep=0.0, launcher="slurm", workers=4))
    with BackgroundLoad(jobs=7, duration_s=(30.0, 40.0), seed=1) as load:
        import time

        t0 = time.time()
        while load._count() < 7 and time.time() - t0 < 20:
            time.sleep(0.2)
        Experiment(cfg).run()
    ev = list(iter_events(cfg.expdir / "events.jsonl"))
    cancelled = [e for e in ev if e["event"] == "job_cancel"]
    assert cancelled and all(e["state"] in ("pending", "running") for e in cancelled)
    assert any(e["state"] == "pending" for e in cancelled)
    rep = load_report(cfg.expdir)
    assert rep.cycles[0].queuing > 0


def _sbatch(out: Path, name: str, seconds: float, after: str | None = None) -> str:
    import subprocess

    argv = ["sbatch", "--parsable", "-J", name, "-n", "1", "--time=1", "--output=/dev/null",
            # Written to a temporary name, then renamed: a reader never sees a half-written time.
            f"--wrap=date +%s.%N > {out / name}.tmp && mv {out / name}.tmp {out / name}; sleep {seconds}"]
    if after:
        argv.insert(1, f"--dependency=afterany:{after}")
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def test_a_dependent_job_queues_from_its_eligible_time(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Node full; D, then A (after D), then L1..L8 queue. A is submitted before the L jobs but
    becomes eligible after them, so (as with production age priorities) the L jobs run first."""
    import time

    fill = [_sbatch(tmp_path, f"fill{i}", 4.0) for i in range(slurm.cpus)]
    d = _sbatch(tmp_path, "D", 1.0)
    _sbatch(tmp_path, "A", 0.5, after=d)
    for i in range(slurm.cpus):
        _sbatch(tmp_path, f"L{i}", 3.0)
    deadline = time.time() + 60
    while not (tmp_path / "A").exists() and time.time() < deadline:
        time.sleep(0.2)
    start = {p.name: float(p.read_text()) for p in tmp_path.iterdir() if p.suffix != ".tmp"}
    assert len(fill) == slurm.cpus and "A" in start
    # D and seven L jobs took the freed CPUs; D's CPU then went to the eighth L job, which became
    # eligible before A (with plain FIFO, A would have had it); A waits for the next free CPU.
    assert start["A"] > start["D"] + 1.0
    assert all(start[f"L{i}"] < start["A"] for i in range(slurm.cpus))


def test_eligible_ranking_releases_a_held_job_whose_dependency_slurm_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: SLURM may mark a held job's dependency fulfilled (shown as ``(null)``) before the
    next pass sees it unfulfilled-and-done; the job must still be released, not held forever."""
    import subprocess

    from enkflow_testing import localslurm

    calls: list[list[str]] = []
    monkeypatch.setattr(localslurm.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    ranking = localslurm.EligibleRanking()
    queues = [
        {"10": ("RUNNING", "(null)"), "11": ("PENDING", "afterany:10(unfulfilled)")},
        {"10": ("RUNNING", "(null)"), "11": ("PENDING", "afterany:10(unfulfilled)")},
        {"11": ("PENDING", "(null)")},  # 10 ended and SLURM cleared the dependency
    ]
    monkeypatch.setattr(ranking, "_queue", lambda: queues.pop(0))
    ranking.step()
    assert calls == [["scontrol", "hold", "11"]]
    ranking.step()  # its dependency still runs: stays held
    assert len(calls) == 1
    ranking.step()
    assert calls[-1] == ["scontrol", "release", "11"] and not ranking.held


def test_background_load_durations() -> None:
    """Durations stay in range; log-uniform ones have the geometric mean as median (heavy upper tail)."""
    import statistics

    import random

    for law, median in (("uniform", 65.0), ("loguniform", (10.0 * 120.0) ** 0.5)):
        rng = random.Random(5)
        d = [BackgroundLoad.draw(rng, (10.0, 120.0), law)[0] for _ in range(20000)]
        assert 10.0 <= min(d) and max(d) <= 120.0
        assert statistics.median(d) == pytest.approx(median, rel=0.03)
    with pytest.raises(ValueError, match="distribution"):
        BackgroundLoad(3, (10.0, 120.0), distribution="normal")
    with pytest.raises(ValueError, match="duration_s"):
        BackgroundLoad(3, (0.0, 120.0))


def test_table2_short(slurm: LocalSlurm, tmp_path: Path, synth: Path) -> None:
    """The short version of benchmarks/table2.py: one cycle per strategy on a node kept full by other jobs.

    Checks what makes the strategies differ, not their times (benchmarks/table2.py measures those):
    the dynamic scheme runs the analysis inside a pilot that is already running (no queue wait
    after the members), the per-member analysis job waits for its members and then queues, and
    all three give the same restarts.
    """
    import time

    totals: dict[str, float] = {}
    states: dict[str, list[np.ndarray]] = {}
    with BackgroundLoad(jobs=10, duration_s=(2.0, 8.0), seed=3, distribution="loguniform") as load:
        t0 = time.time()
        while load._count() < 10 and time.time() - t0 < 20:
            time.sleep(0.2)
        time.sleep(3.0)
        for strategy in ("dynamic", "per-member", "single"):
            root = tmp_path / strategy
            cfg = load_experiment(make_experiment(root, synth, cycles=1, model_sleep=1.0, strategy=strategy,
                                                  launcher="slurm", workers=N))
            Experiment(cfg).run()
            ev = list(iter_events(cfg.expdir / "events.jsonl"))
            totals[strategy] = load_report(cfg.expdir).cycles[0].total
            states[strategy] = restarts(root, N)
            roles = {e["job"]: e["role"] for e in ev if e["event"] == "job_submit"}
            ana_start = next(e for e in ev if e["event"] == "task_start" and e["task"] == N + 1)
            last_member_end = max(e["t"] for e in ev if e["event"] == "task_end" and e["task"] <= N)
            first_member_start = min(e["t"] for e in ev if e["event"] == "task_start" and e["task"] <= N)
            job_start = {e["job"]: e["t"] for e in ev if e["event"] == "job_start"}
            if strategy == "dynamic":
                assert set(roles.values()) == {"pilot"} and len(roles) <= N
                # Every pilot was queued before any member ran, and a pilot that was running when the
                # members ended took the analysis (any of them: one may have run no member, the others
                # having taken them all): nothing queued after the members, no second queue wait.
                assert all(e["t"] <= first_member_start for e in ev if e["event"] == "job_submit")
                assert job_start[ana_start["job"]] <= last_member_end
            elif strategy == "per-member":
                assert sorted(roles.values()) == ["analysis"] + ["member"] * N
                assert roles[ana_start["job"]] == "analysis" and ana_start["t"] > last_member_end
            else:
                assert list(roles.values()) == ["all"]
    for strategy in ("per-member", "single"):
        assert all(np.array_equal(a, b) for a, b in zip(states[strategy], states["dynamic"]))
    print(f"short Table 2 (1 cycle, N_e = {N}, 8-CPU node under load): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in totals.items()))


def test_a_driver_killed_while_the_next_cycles_pilots_queue_is_resumed_bitwise_leaving_no_job(
        slurm: LocalSlurm, tmp_path: Path, synth: Path, reference: list[np.ndarray]) -> None:
    """Pilots that span cycles: the next cycle's pilots are submitted while the analysis runs; the
    node is full of other jobs, so they queue. ``kill -9`` of the driver then leaves them in the
    queue: the rerun cancels them (they would start later and wait for nothing), finishes the study
    bitwise, and at its end ``squeue`` holds no job of the study."""
    import os
    import signal
    import subprocess
    import sys
    import time

    toml = make_experiment(tmp_path, synth, cycles=2, model_sleep=0.0, analysis_sleep=4.0, launcher="slurm", workers=N,
                           jobs_extra="idle_timeout = 1.0")  # the pilots that do not run the analysis leave
    events = tmp_path / "exp" / "events.jsonl"
    with BackgroundLoad(jobs=slurm.cpus + 4, duration_s=(6.0, 10.0), seed=5) as load:
        t0 = time.time()
        while load._count() < slurm.cpus + 4 and time.time() - t0 < 20:
            time.sleep(0.2)
        code = "import sys; from enkflow.experiment import Experiment, load_experiment; Experiment(load_experiment(sys.argv[1])).run()"
        driver = subprocess.Popen([sys.executable, "-c", code, str(toml)], env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                                  start_new_session=True)
        queued: list[str] = []
        deadline = time.time() + 240
        try:
            while time.time() < deadline and not queued and driver.poll() is None:
                ev = list(iter_events(events)) if events.exists() else []
                ana = [e["t"] for e in ev if e["event"] == "task_start" and e.get("cycle") == 1 and e["task"] == N + 1]
                ahead = [e["job"] for e in ev if e["event"] == "job_submit" and ana and e["t"] >= ana[0]]
                if ahead:
                    pending = subprocess.run(["squeue", "--me", "-h", "-t", "PENDING", "-o", "%i"], capture_output=True,
                                             text=True).stdout.split()
                    queued = [j for j in ahead if j in pending]
                time.sleep(0.1)
        finally:
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()
        assert queued, "no pilot of the next cycle was seen queued while the analysis ran"
        Experiment(load_experiment(toml)).run()
    for a, b in zip(restarts(tmp_path, N), reference):
        assert np.array_equal(a, b)
    ev = list(iter_events(events))
    cancelled = [j for e in ev if e["event"] == "earlier_jobs_cancelled" for j in e["jobs"]]
    assert set(queued) <= set(cancelled)
    ours = {e["job"] for e in ev if e["event"] == "job_submit"}
    left = subprocess.run(["squeue", "--me", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert not ours & set(left)
    ends = {}
    for e in ev:
        if e["event"] == "task_end":
            ends[(e["cycle"], e["task"])] = ends.get((e["cycle"], e["task"]), 0) + 1
    assert sorted(ends) == [(c, t) for c in (1, 2) for t in range(1, N + 2)] and set(ends.values()) == {1}
