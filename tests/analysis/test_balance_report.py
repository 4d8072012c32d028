"""What a user sees of the analysis balance in an experiment: the analysis task's timing event keeps
the per-rank lists, and `enkflow report` shows the imbalance per cycle and, with --members, per rank."""

from __future__ import annotations

from pathlib import Path

from enkflow.experiment.config import load_experiment
from enkflow.experiment.driver import Experiment
from enkflow.jobs.events import iter_events
from enkflow.jobs.worker import read_timings, timing_record
from enkflow.report import load_report, render_report, report_json
from enkflow_testing.experiments import synth_problem, write_builtin_experiment

N = 4


def test_timing_files_keep_numbers_and_per_rank_lists_only(tmp_path: Path) -> None:
    rec = timing_record({"analysis_s": 2, "imbalance_cpu": 1.25, "rank_cpu_s": [1.0, 2], "ok": True,
                         "name": "x", "empty": [], "mixed": [1.0, "a"]})
    assert rec == {"analysis_s": 2.0, "imbalance_cpu": 1.25, "rank_cpu_s": [1.0, 2.0]}
    p = tmp_path / "t.json"
    p.write_text('{"read_s": 0.5, "rank_rows": [3, 4], "flag": false}')
    assert read_timings(p) == {"read_s": 0.5, "rank_rows": [3.0, 4.0]}
    assert read_timings(tmp_path / "missing.json") == {}


def test_a_two_rank_analysis_reports_its_balance_per_cycle_and_per_rank(tmp_path: Path, mpiexec: str) -> None:
    problem = synth_problem(tmp_path / "synth", N)
    toml = write_builtin_experiment(tmp_path / "run", problem, members=N, cycles=1, analysis_launcher=f"{mpiexec} -n 2")
    cfg = load_experiment(toml)
    Experiment(cfg).run()
    (end,) = [e for e in iter_events(cfg.expdir / "events.jsonl") if e["event"] == "task_end" and e["member"] is None]
    t = end["timings"]
    for key in ("rank_cpu_s", "rank_analysis_s", "rank_est_work", "rank_rows", "rank_search_s", "rank_kernel_s"):
        assert isinstance(t[key], list) and len(t[key]) == 2, key
    assert sum(t["rank_rows"]) > 0 and abs(sum(t["rank_est_work"]) - 1.0) < 1e-9
    assert t["imbalance_cpu"] >= 1.0 and t["imbalance_est"] >= 1.0
    rep = load_report(cfg.expdir)
    text = render_report(rep, members=True)
    assert "an.imbal" in text and f"{t['imbalance_cpu']:8.2f}" in text
    assert "analysis rank   0" in text and "analysis rank   1" in text
    assert report_json(rep)["cycles"][0]["analysis"]["rank_cpu_s"] == t["rank_cpu_s"]
