"""The SLURM launcher against a real one-node SLURM started by the test.

Installs ``slurmctld slurmd slurm-client munge`` with apt-get when they are
absent (root only) and skips, with the reason, where that is impossible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import EnkflowError
from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from enkflow.jobs.localslurm import BackgroundLoad, LocalSlurm, missing_reason
from enkflow.report import load_report
from jobs_helpers.experiments import make_experiment, restarts, synth_members

pytestmark = pytest.mark.slurm
N = 4


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(f"local SLURM unavailable: {reason}")
    ls = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=8)
    try:
        ls.start()
    except EnkflowError as exc:
        if "installing" in str(exc):
            pytest.skip(f"local SLURM unavailable: {exc}")
        raise
    yield ls
    ls.stop()


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_members(tmp_path_factory.mktemp("synth"), N)


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


def test_table2_short_dynamic_beats_the_all_resources_job_under_load(slurm: LocalSlurm, tmp_path: Path, synth: Path) -> None:
    """The short version of benchmarks/table2.py: one cycle per strategy on a node kept full by other jobs."""
    totals = {}
    with BackgroundLoad(jobs=10, duration_s=(6.0, 14.0), seed=3) as load:
        import time

        t0 = time.time()
        while load._count() < 10 and time.time() - t0 < 20:
            time.sleep(0.2)
        time.sleep(5.0)
        for strategy in ("dynamic", "single"):
            root = tmp_path / strategy
            cfg = load_experiment(make_experiment(root, synth, cycles=1, model_sleep=1.0, strategy=strategy,
                                                  launcher="slurm", workers=N))
            Experiment(cfg).run()
            totals[strategy] = load_report(cfg.expdir).cycles[0].total
    print(f"short Table 2 (1 cycle, N_e = {N}, 8-CPU node under load): {totals}, "
          f"dynamic/single = {totals['dynamic'] / totals['single']:.2f}")
    assert totals["dynamic"] < totals["single"]
