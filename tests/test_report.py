"""Time accounting from synthetic event logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enkflow.cli import main
from enkflow.errors import EnkflowError
from enkflow.report import _union_length, cycle_timings, load_report


def test_union_length_merges_and_clips() -> None:
    assert _union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(4.0)
    assert _union_length([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(2.0)
    assert _union_length([], 0, 1) == 0.0


def test_cycle_figures_add_up_and_queue_is_time_without_running_jobs() -> None:
    ev = [
        {"t": 0.0, "event": "cycle_start", "cycle": 1},
        {"t": 0.1, "event": "job_submit", "cycle": 1, "job": "a"},
        {"t": 0.1, "event": "job_submit", "cycle": 1, "job": "b"},
        {"t": 4.0, "event": "job_start", "cycle": 1, "job": "a", "worker": "wa"},
        {"t": 4.1, "event": "task_start", "cycle": 1, "task": 1, "member": 1, "worker": "wa"},
        {"t": 6.0, "event": "job_start", "cycle": 1, "job": "b", "worker": "wb"},
        {"t": 6.1, "event": "task_start", "cycle": 1, "task": 2, "member": 2, "worker": "wb"},
        {"t": 7.1, "event": "task_end", "cycle": 1, "task": 1, "member": 1, "worker": "wa", "run_s": 3.0, "io_s": 0.5},
        {"t": 9.1, "event": "task_end", "cycle": 1, "task": 2, "member": 2, "worker": "wb", "run_s": 3.0, "io_s": 0.25},
        {"t": 9.2, "event": "job_end", "cycle": 1, "job": "a", "worker": "wa"},
        {"t": 9.2, "event": "task_start", "cycle": 1, "task": 3, "member": None, "worker": "wb"},
        {"t": 11.2, "event": "task_end", "cycle": 1, "task": 3, "member": None, "worker": "wb", "run_s": 2.0,
         "timings": {"read_s": 0.5, "write_s": 0.5, "compute_s": 1.0}},
        {"t": 11.3, "event": "job_end", "cycle": 1, "job": "b", "worker": "wb"},
        {"t": 11.5, "event": "cycle_end", "cycle": 1},
    ]
    (c,) = cycle_timings(ev)
    assert c.total == pytest.approx(11.5)
    assert c.queuing == pytest.approx(4.0 + 0.2)  # before job a started, and after job b ended
    assert c.io == pytest.approx(1.0)
    assert c.running == pytest.approx((9.1 - 4.1) + (11.2 - 9.2) - 1.0)  # union of task intervals, less analysis I/O
    assert c.queuing + c.running + c.io + c.overhead == pytest.approx(c.total)
    assert c.member_io == pytest.approx(0.75)
    assert c.analysis_compute == pytest.approx(1.0)
    assert c.members[1]["wait_s"] == pytest.approx(4.1) and c.members[2]["wait_s"] == pytest.approx(6.1)


# --- which directory `enkflow report` reads ----------------------------------------------------

_EVENTS = [
    {"t": 0.0, "event": "experiment_start", "strategy": "dynamic", "launcher": "local"},
    {"t": 0.0, "event": "cycle_start", "cycle": 1},
    {"t": 1.0, "event": "cycle_end", "cycle": 1},
]


def _run_dir(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _EVENTS))
    return d


def test_report_of_the_directory_the_demo_names_reads_its_run_directory(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # `enkflow demo` prints DIR; the run (events.jsonl) is DIR/run, named by DIR/experiment.toml.
    demo = tmp_path / "enkflow-demo"
    run = _run_dir(demo / "run")
    (demo / "experiment.toml").write_text('[experiment]\ndirectory = "run"\ncycles = 1\n')
    for arg in (demo, demo / "experiment.toml", run):
        assert load_report(arg).expdir.resolve() == run.resolve()
        assert [c.cycle for c in load_report(arg).cycles] == [1]
    assert main(["report", str(demo)]) == 0
    assert f"experiment {run.resolve()}" in capsys.readouterr().out


def test_report_names_the_runs_below_or_the_one_the_toml_names(tmp_path: Path) -> None:
    two = tmp_path / "two"
    a, b = _run_dir(two / "a"), _run_dir(two / "b")
    with pytest.raises(EnkflowError, match="2 are below it") as ei:
        load_report(two)
    assert str(a.resolve()) in str(ei.value) and str(b.resolve()) in str(ei.value)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "exp.toml").write_text('[experiment]\ndirectory = "exp"\n')
    with pytest.raises(EnkflowError, match="no events.jsonl") as ei:
        load_report(fresh)
    assert str((fresh / "exp").resolve()) in str(ei.value) and "enkflow run" in str(ei.value)
    with pytest.raises(EnkflowError, match="no such experiment directory"):
        load_report(tmp_path / "nowhere")
