"""`enkflow demo` end to end: synthesize, cycle with the local launcher, report, RMSE."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from enkflow.experiment.demo import DemoSettings, run_demo
from jobs_helpers.experiments import TOY_ANALYSIS

BUILTIN = importlib.util.find_spec("enkflow.experiment.analysis_step") is not None


def test_demo_runs_and_the_analysis_rmse_falls(tmp_path: Path) -> None:
    lines: list[str] = []
    # Without the built-in analysis the demo still runs the whole workflow with an external analysis program.
    command = None if BUILTIN else f"{sys.executable} {TOY_ANALYSIS} {{config}} {{cycle}}"
    out = run_demo(tmp_path / "demo", DemoSettings(members=6, cycles=3, analysis_command=command), say=lines.append)
    text = "\n".join(lines)
    assert "mean +- std over 3 cycle(s)" in text and "analysis RMSE" in text
    assert [c.cycle for c in out["report"].cycles] == [1, 2, 3]
    assert sorted(out["rmse"]) == [0, 1, 2, 3]
    if BUILTIN:
        assert out["rmse"][3] < out["rmse"][0]
