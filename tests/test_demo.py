"""`enkflow demo` end to end: synthesize, cycle with the local launcher and the built-in analysis, report, RMSE."""

from __future__ import annotations

from pathlib import Path

from enkflow.apps.demo import DemoSettings, run_demo


def test_demo_runs_and_the_analysis_rmse_falls(tmp_path: Path) -> None:
    lines: list[str] = []
    out = run_demo(tmp_path / "demo", DemoSettings(members=6, cycles=3), say=lines.append)
    text = "\n".join(lines)
    assert "mean +- std over 3 cycle(s)" in text and "analysis RMSE" in text
    assert [c.cycle for c in out["report"].cycles] == [1, 2, 3]
    assert sorted(out["rmse"]) == [0, 1, 2, 3]
    assert out["rmse"][3] < out["rmse"][0]
