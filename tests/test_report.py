"""Time accounting from synthetic event logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enkflow.cli import main
from enkflow.errors import EnkflowError
from enkflow.report import load_report, render_report, report_json, write_html
from enkflow.report.timing import _union_length, cycle_timings


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


# --- online experiments --------------------------------------------------------------------------

_NAN = "server rank 0 rejected the forecast: member 2, field 'x': element 3 is nan (NaN or Inf in the forecast)"
_ONLINE = [
    {"t": 0.0, "event": "experiment_start", "mode": "online", "cycles": [1, 2], "members": 2, "runners": 2, "ranks": 1,
     "launcher": "local"},
    {"t": 0.1, "event": "server_start", "job": "j1", "restart": 0, "ranks": 1},
    {"t": 0.5, "event": "online_start", "cycles": [1, 2], "members": 2, "ranks": 1, "resumed": False,
     "recovered_forecasts": []},
    {"t": 0.5, "event": "cycle_start", "cycle": 1},
    {"t": 0.6, "event": "runner_join", "runner": "a", "id": 1, "ranks": 1},
    {"t": 0.6, "event": "task_assign", "cycle": 1, "member": 1, "task": 1, "runner": "a"},
    {"t": 0.7, "event": "task_assign", "cycle": 1, "member": 2, "task": 2, "runner": "b"},
    {"t": 1.0, "event": "online_reject", "reason": _NAN[len("server rank 0 rejected the forecast: "):], "socket": "data",
     "rank": 0, "runner": 2, "kind": "PUT"},
    {"t": 1.0, "event": "task_requeue", "cycle": 1, "member": 2, "task": 2, "reason": "rejected", "error": _NAN},
    {"t": 1.2, "event": "task_done", "cycle": 1, "member": 1, "task": 1},
    {"t": 1.2, "event": "task_assign", "cycle": 1, "member": 2, "task": 3, "runner": "a"},
    {"t": 2.0, "event": "task_done", "cycle": 1, "member": 2, "task": 3},
    {"t": 2.5, "event": "online_cycle_end", "cycle": 1, "forecast_s": 1.5, "transfer_s": 0.25, "analysis_s": 0.5,
     "runner_idle_s": 0.75, "checkpoint_wait_s": 0.125, "tasks": 3.0, "recomputed": 1.0, "recovered": 0.0, "runners": 2.0,
     "n_obs": 10.0, "omb_rms": 1.0, "oma_rms": 0.5, "redone_rejected": 1.0},
    {"t": 2.5, "event": "cycle_end", "cycle": 1},
    {"t": 2.6, "event": "cycle_start", "cycle": 2},
    {"t": 2.7, "event": "task_assign", "cycle": 2, "member": 1, "task": 4, "runner": "a"},
    {"t": 3.0, "event": "task_done", "cycle": 2, "member": 1, "task": 4},
    {"t": 3.1, "event": "server_crash", "restart": 1},
    {"t": 3.2, "event": "server_start", "job": "j2", "restart": 1, "ranks": 1},
    {"t": 3.5, "event": "online_start", "cycles": [2], "members": 2, "ranks": 1, "resumed": True, "recovered_forecasts": [1]},
    {"t": 3.5, "event": "cycle_start", "cycle": 2},
    {"t": 3.6, "event": "task_assign", "cycle": 2, "member": 2, "task": 1, "runner": "b"},  # a new server counts from 1
    {"t": 3.8, "event": "task_requeue", "cycle": 2, "member": 2, "task": 1, "reason": "lost",
     "error": "runner b sent no heartbeat for 10.2 s (killed, hung or cut off)"},
    {"t": 3.9, "event": "runner_exit", "job": "j3"},
    {"t": 3.9, "event": "task_assign", "cycle": 2, "member": 2, "task": 2, "runner": "a"},
    {"t": 4.5, "event": "task_done", "cycle": 2, "member": 2, "task": 2},
    {"t": 5.0, "event": "online_cycle_end", "cycle": 2, "forecast_s": 1.0, "transfer_s": 0.5, "analysis_s": 0.5,
     "runner_idle_s": 0.25, "checkpoint_wait_s": 0.0, "tasks": 2.0, "recomputed": 1.0, "recovered": 1.0, "runners": 1.0,
     "n_obs": 10.0, "omb_rms": 0.75, "oma_rms": 0.25, "redone_lost": 1.0},
    {"t": 5.0, "event": "cycle_end", "cycle": 2},
    {"t": 5.1, "event": "experiment_end", "cycles": [1, 2]},
]


def test_online_report_shows_the_servers_time_accounting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _ONLINE))
    rep = load_report(d)
    assert rep.mode == "online" and (rep.runners, rep.ranks, rep.launcher) == (2, 1, "local")
    c1, c2 = rep.cycles
    assert (c1.cycle, c1.total, c1.forecast, c1.transfer, c1.analysis, c1.runner_idle) == (1, 2.0, 1.5, 0.25, 0.5, 0.75)
    assert (c1.tasks, c1.recomputed, c1.recovered, c1.requeues, c1.checkpoint_wait) == (3, 1, 0, 1, 0.125)
    assert c1.diagnostics["omb_rms"] == 1.0 and c1.diagnostics["redone_rejected"] == 1.0 and "forecast_s" not in c1.diagnostics
    assert c1.members[2]["attempts"] == 2 and c1.members[2]["runner"] == "a"
    assert c1.members[2]["run_s"] == pytest.approx(0.8) and c1.members[2]["wait_s"] == pytest.approx(0.2)
    # Cycle 2 ran across a server restart: from its first start to its end; 1 forecast recovered.
    assert c2.total == pytest.approx(2.4) and (c2.tasks, c2.recomputed, c2.recovered) == (2, 1, 1)
    assert c2.members[2]["runner"] == "a" and c2.members[2]["run_s"] == pytest.approx(0.6)

    s = rep.summary()
    assert s["forecast"]["mean"] == pytest.approx(1.25) and s["analysis"]["std"] == 0.0
    assert s["runner_idle"]["mean"] == pytest.approx(0.5) and s["runner_idle"]["pct_mean"] is None
    assert set(s) == {"total", "forecast", "transfer", "analysis", "runner_idle"}

    w = rep.warnings
    assert f"cycle 1, member 2: rescheduled (rejected): {_NAN}" in w
    assert "cycle 2, member 2: rescheduled (lost): runner b sent no heartbeat for 10.2 s (killed, hung or cut off)" in w
    assert any("the server exited without finishing" in x and "restart 1" in x for x in w)
    assert any("resumed from its checkpoints at cycle 2; 1 forecast(s) of that cycle recovered" in x for x in w)
    assert any("runner job j3 exited" in x for x in w)
    assert any(x.startswith("the server refused 1 message(s): member 2, field 'x': element 3 is nan") for x in w)

    assert main(["report", str(d)]) == 0
    text = capsys.readouterr().out
    assert "online: 2 runners, 1 server rank, launcher local" in text
    assert "strategy" not in text and "queuing" not in text
    header = next(line for line in text.splitlines() if line.lstrip().startswith("cycle"))
    assert header.split() == ["cycle", "total", "forecast", "transfer", "analysis", "run.idle", "tasks", "recomputed",
                              "recovered"]
    row = next(line for line in text.splitlines() if line.split()[:1] == ["1"])
    assert row.split() == ["1", "2.00", "1.50", "0.25", "0.50", "0.75", "3", "1", "0"]
    assert "warnings (6):" in text and "rescheduled (lost)" in text
    assert "runner idle" in text and "forecast" in text.split("mean +- std")[1]

    assert main(["report", "--members", str(d)]) == 0
    assert "member   2: wait    0.20  forecast    0.80  attempts 2  runner a" in capsys.readouterr().out

    assert main(["report", "--json", str(d)]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["mode"] == "online" and js["runners"] == 2 and js["ranks"] == 1
    assert [c["cycle"] for c in js["cycles"]] == [1, 2]
    assert {k: js["cycles"][0][k] for k in ("forecast", "transfer", "analysis", "runner_idle", "tasks", "recomputed",
                                             "recovered")} == {"forecast": 1.5, "transfer": 0.25, "analysis": 0.5,
                                                               "runner_idle": 0.75, "tasks": 3, "recomputed": 1, "recovered": 0}
    assert js["cycles"][0]["members"]["2"]["attempts"] == 2
    assert js["summary"]["runner_idle"]["pct_mean"] is None and js["warnings"] == w


def test_online_report_before_the_first_cycle_ends(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _ONLINE[:9]))
    rep = load_report(d)
    assert rep.mode == "online" and rep.cycles == []
    text = render_report(rep)
    assert "no finished cycle yet" in text and "rescheduled (rejected)" in text


def test_offline_report_json_is_unchanged(tmp_path: Path) -> None:
    rep = load_report(_run_dir(tmp_path / "off"))
    assert rep.mode == "offline"
    js = report_json(rep)
    assert set(js) == {"expdir", "strategy", "launcher", "cycles", "summary", "warnings"}
    assert set(js["summary"]) == {"total", "queuing", "running", "io", "overhead"}


def test_report_of_a_failed_run_leads_with_the_failure(tmp_path: Path) -> None:
    """The failed member, its error and the log that holds the cause, at the top of the text and the page;
    the protected-restart rerun stays a warning."""
    log = tmp_path / "run" / "cycles" / "0002" / "logs" / "member-3.log"
    report = {"step": "model", "returncode": 1, "argv": ["model", "m3.nc"], "log": str(log),
              "stderr_tail": "Traceback (most recent call last):\nFloatingPointError: overflow in tracer"}
    events = [*_EVENTS,
              {"t": 1.1, "event": "cycle_start", "cycle": 2},
              {"t": 1.2, "event": "task_restore", "cycle": 2, "task": 3, "member": 3},
              {"t": 1.5, "event": "task_fail", "cycle": 2, "task": 3, "member": 3, "final": True, **report},
              {"t": 1.6, "event": "experiment_fail", "cycle": 2, "task": 3, "report": report}]
    d = tmp_path / "run"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = load_report(d)
    text = render_report(rep).splitlines()
    assert text[2] == "FAILED: cycle 2, member 3: model exited with status 1"
    assert "  FloatingPointError: overflow in tracer" in text and f"  the cause is in: {log}" in text
    assert any("rerun from its protected restart" in line for line in text)
    assert report_json(rep)["failure"]["log"] == str(log)
    page = write_html(d, tmp_path / "failed.html").read_text()
    assert page.index("id='failure'") < page.index("id='settings'") and "FloatingPointError: overflow" in page
    # A rerun that went past the failure (--retry-failed) leaves it in the log's history, not at the top.
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        *events, {"t": 2.0, "event": "resume", "cycles": [2]}, {"t": 3.0, "event": "experiment_end"}]))
    rep = load_report(d)
    assert rep.failure is None and "FAILED" not in render_report(rep) and "failure" not in report_json(rep)


def test_seconds_under_a_tenth_keep_two_significant_digits(tmp_path: Path) -> None:
    """A 4 ms analysis shows as 0.004 in the an.comp column, not 0.00."""
    ev = [{"t": 0.0, "event": "cycle_start", "cycle": 1},
          {"t": 0.1, "event": "task_start", "cycle": 1, "task": 3, "member": None, "worker": "w"},
          {"t": 0.5, "event": "task_end", "cycle": 1, "task": 3, "member": None, "worker": "w", "run_s": 0.4,
           "timings": {"read_s": 0.01, "analysis_s": 0.0042}},
          {"t": 0.6, "event": "cycle_end", "cycle": 1}]
    d = tmp_path / "run"
    d.mkdir()
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    row = render_report(load_report(d)).splitlines()[4].split()
    assert row[0] == "1" and row[7] == "0.0042"


def test_report_of_a_failed_online_study_names_its_reason(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    reason = "runner 2 exited with status 1; runner-2.log ends with: FloatingPointError: overflow"
    events = [*_ONLINE[:9], {"t": 9.0, "event": "experiment_fail", "cycle": 1, "member": 3, "reason": reason}]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = load_report(d)
    assert rep.mode == "online" and render_report(rep).splitlines()[2] == f"FAILED: cycle 1, member 3: {reason}"
