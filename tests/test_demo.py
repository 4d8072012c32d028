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


def test_the_demo_writes_the_method_its_options_and_the_adaptive_target(tmp_path: Path) -> None:
    from enkflow.config import AdaptiveTarget, Method
    from enkflow.experiment.config import load_experiment
    from enkflow.experiment.demo_problem import prepare

    s = DemoSettings(members=3, cycles=1, method=Method.LNETF, method_options={"rs": 2.0, "rotate": True},
                     adaptive="anderson2009", adaptive_target=AdaptiveTarget.POSTERIOR)
    analysis = load_experiment(prepare(tmp_path, s, say=lambda _: None)).analysis
    assert analysis.method is Method.LNETF and analysis.lnetf.rs == 2.0 and analysis.lnetf.rotate
    assert analysis.inflation.adaptive_target is AdaptiveTarget.POSTERIOR and analysis.localization.radius == s.radius
