"""The key-by-key difference a refused resume reports (enkflow.experiment.settings_diff)."""

from __future__ import annotations

from enkflow.experiment.settings_diff import UNSET, SettingChange, changed_settings


def test_nested_keys_and_lists_are_named_with_both_values() -> None:
    old = {"analysis": {"inflation": {"prior": 1.05}, "localization": {"radius": [2.0, 3.0]}, "method": "letkf"},
           "observations": {"kinds": {"sst": {"error": 0.5}}}, "state": {"variables": ["t"]}}
    new = {"analysis": {"inflation": {"prior": 1.10}, "localization": {"radius": [2.0, 4.0]}, "method": "letkf"},
           "observations": {"kinds": {"sst": {"error": 0.5, "code": 3}}}, "state": {"variables": ["t", "s"]}}
    changes = changed_settings(old, new)
    assert changes == [SettingChange("analysis.inflation.prior", 1.05, 1.10),
                       SettingChange("analysis.localization.radius[1]", 3.0, 4.0),
                       SettingChange("observations.kinds.sst.code", UNSET, 3),
                       SettingChange("state.variables", ["t"], ["t", "s"])]
    assert [str(c) for c in changes] == ["analysis.inflation.prior: 1.05 -> 1.1",
                                         "analysis.localization.radius[1]: 3.0 -> 4.0",
                                         "observations.kinds.sst.code: (not set) -> 3",
                                         'state.variables: ["t"] -> ["t", "s"]']
    assert changed_settings(old, old) == []
