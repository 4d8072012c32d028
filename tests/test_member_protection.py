"""A forecast is applied exactly once: half-written restarts are never accepted, a model that
did nothing is reported, a model that wrote no {output} stops the experiment at once."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from enkflow.errors import MemberError
from enkflow.experiment import Experiment, load_experiment
from enkflow.jobs.events import iter_events
from jobs_helpers.experiments import HERE, make_experiment, restarts

N = 4
CYCLES = 2


def events(cfg, name: str) -> list[dict]:
    return [e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == name]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, synth: Path) -> list[np.ndarray]:
    root = tmp_path_factory.mktemp("ref")
    Experiment(load_experiment(make_experiment(root, synth, cycles=CYCLES, model_sleep=0.0))).run()
    return restarts(root, N)


def faulty(mode: str, root: Path, members: str = "2") -> str:
    flags = root / "flags"
    flags.mkdir(parents=True, exist_ok=True)
    return (f"{sys.executable} {HERE / 'faulty_model.py'} {mode} {flags} {members} "
            "{restart} {length} {cycle} {member}")


@pytest.mark.parametrize("mode", ["kill", "exit1", "killworker"])
def test_a_rerun_starts_from_the_protected_restart(tmp_path: Path, synth: Path, reference: list[np.ndarray], mode: str) -> None:
    # kill / exit1: the model rewrote half its restart in place and died (SIGKILL) or exited 1.
    # Before: the worker saw a changed fingerprint and accepted the corrupt restart as the forecast.
    # killworker: the forecast was applied, then the worker died before recording it; the rerun
    # must not apply it a second time.
    root = tmp_path / "run"
    cfg = load_experiment(make_experiment(root, synth, cycles=CYCLES, model_command=faulty(mode, root, "2,3")))
    Experiment(cfg).run()
    for a, b in zip(restarts(root, N), reference):
        assert np.array_equal(a, b)
    restored = {(e["cycle"], e["member"]) for e in events(cfg, "task_restore")}
    assert {(1, 2), (1, 3), (2, 2), (2, 3)} <= restored
    assert not list((root / "members").glob(".*.orig*")), "protected copies are removed once the member is done"


def test_a_model_that_left_its_restart_unchanged_is_reported(tmp_path: Path, synth: Path) -> None:
    root = tmp_path / "run"
    cfg = load_experiment(make_experiment(root, synth, cycles=1, model_command="true {restart}"))
    before = restarts(root, N)
    Experiment(cfg).run()
    warned = events(cfg, "task_unchanged")
    assert sorted(e["member"] for e in warned) == list(range(1, N + 1))
    from enkflow.report import load_report, render_report

    text = render_report(load_report(cfg.expdir))
    assert "unchanged" in text and "member 1" in text
    assert all(not np.array_equal(a, b) for a, b in zip(restarts(root, N), before))  # the analysis still ran

    root2 = tmp_path / "strict"
    cfg2 = load_experiment(make_experiment(root2, synth, cycles=1, model_command="true {restart}",
                                           model_extra='unchanged = "error"'))
    with pytest.raises(MemberError, match=r"member 1, cycle 1: model: the model exited 0 but left its restart .*unchanged"):
        Experiment(cfg2).run()


def test_a_model_that_wrote_no_output_stops_at_once(tmp_path: Path, synth: Path) -> None:
    root = tmp_path / "run"
    cfg = load_experiment(make_experiment(root, synth, cycles=1, model_command="true {restart} {output}"))
    with pytest.raises(MemberError, match=r"cycle 1: model: the model exited 0 but wrote no \{output\} file") as err:
        Experiment(cfg).run()
    assert "command: true " in str(err.value)
    assert len(events(cfg, "job_submit")) <= N  # one round of pilots, no resubmissions
    fails = events(cfg, "task_fail")
    assert all(e["final"] for e in fails)


def test_the_analysis_task_starts_without_a_warning_in_its_log(subprocess_env: dict[str, str]) -> None:
    # Its stderr tail is what an error report quotes: a RuntimeWarning from a module loaded twice
    # (the driver imported the task module) cluttered every analysis log.
    import subprocess

    out = subprocess.run([sys.executable, "-m", "enkflow.experiment.analysis_task"], capture_output=True, text=True,
                         env=subprocess_env, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("usage:"), out.stderr
