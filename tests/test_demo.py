"""`enkflow demo`'s experiment file (its end-to-end run, offline and online, is
tests/online/test_online_modes.py::test_demo_online_is_bitwise_the_offline_demo)."""

from __future__ import annotations

from pathlib import Path

from enkflow.apps.demo import DemoSettings


def test_the_demo_writes_the_method_its_options_and_the_adaptive_target(tmp_path: Path) -> None:
    from enkflow.config import AdaptiveTarget, Method
    from enkflow.experiment.config import load_experiment
    from enkflow.experiment.demo_problem import prepare

    s = DemoSettings(members=3, cycles=1, method=Method.LNETF, method_options={"rs": 2.0, "rotate": True},
                     adaptive="anderson2009", adaptive_target=AdaptiveTarget.POSTERIOR)
    analysis = load_experiment(prepare(tmp_path, s, say=lambda _: None)).analysis
    assert analysis.method is Method.LNETF and analysis.lnetf.rs == 2.0 and analysis.lnetf.rotate
    assert analysis.inflation.adaptive_target is AdaptiveTarget.POSTERIOR and analysis.localization.radius == s.radius
