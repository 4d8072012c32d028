"""Unknown (typo'd) configuration keys are named with the nearest valid key."""

from __future__ import annotations

from pathlib import Path

import pytest

from enkflow.config import AnalysisConfig, validate
from enkflow.errors import ConfigError
from enkflow.experiment.config import load_experiment

TOML = '''
[experiment]
cycles = 2
members = 3
restart = "members/member_{member:04d}.nc"
forecast_length = 6

[model]
command = "model {restart}"

[observations]
file = "obs/obs_{cycle:03d}.nc"

[analysis]
method = "letkf"
localization = { radius = 500.0, metric = "sphere" }
'''


def _load(tmp_path: Path, text: str) -> ConfigError:
    toml = tmp_path / "exp.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_experiment(toml)
    assert str(toml) in str(ei.value)
    return ei.value


def test_the_valid_file_loads(tmp_path: Path) -> None:
    (tmp_path / "exp.toml").write_text(TOML)
    assert load_experiment(tmp_path / "exp.toml").experiment.forecast_length == 6


def test_typo_of_a_required_key_is_one_message_naming_both(tmp_path: Path) -> None:
    err = _load(tmp_path, TOML.replace("forecast_length = 6", "forcast_length = 6"))
    assert err.key == "experiment.forcast_length"
    msg = str(err)
    assert msg.startswith("unknown key experiment.forcast_length, did you mean forecast_length?")
    assert "forecast_length is required and missing" in msg
    assert "Field required" not in msg


@pytest.mark.parametrize("old, new, key, suggestion", [
    ("[model]", "[modle]", "modle", "model"),                                     # a table name
    ('method = "letkf"', 'methd = "letkf"', "analysis.methd", "method"),          # an optional key
    ('metric = "sphere"', 'metrc = "sphere"', "analysis.localization.metrc", "metric"),  # in an inline table
    ("[analysis]", "[analysis]\ninflaton = { prior = 1.1 }", "analysis.inflaton", "inflation"),
    ("[model]", "[jobs]\nwrokers = 2\n\n[model]", "jobs.wrokers", "workers"),
])
def test_unknown_key_names_the_nearest_valid_one(tmp_path: Path, old: str, new: str, key: str, suggestion: str) -> None:
    err = _load(tmp_path, TOML.replace(old, new, 1))
    assert err.key == key
    assert f"unknown key {key}, did you mean {suggestion}?" in str(err)


def test_unknown_key_without_a_near_one_lists_the_valid_keys(tmp_path: Path) -> None:
    err = _load(tmp_path, TOML.replace("[model]", "[model]\nzzz = 1"))
    assert err.key == "model.zzz"
    assert "unknown key model.zzz; valid keys here:" in str(err) and "command" in str(err)


def test_prefix_and_a_missing_key_without_typo() -> None:
    with pytest.raises(ConfigError, match=r"unknown key analysis\.kernal, did you mean kernel\?") as ei:
        validate(AnalysisConfig, {"kernal": "compiled"}, prefix="analysis")
    assert ei.value.key == "analysis.kernal"
    with pytest.raises(ConfigError, match="required key missing") as ei:
        validate(AnalysisConfig, {"method": "letkf", "localization": {"metric": "sphere"}}, prefix="analysis")
    assert ei.value.key == "analysis.localization.radius"


def test_analysis_keys_added_later_leave_the_digest_alone_at_their_defaults(tmp_path: Path) -> None:
    """An experiment directory made before a key existed can be resumed: at its default the key is not
    hashed; set, it is."""
    import hashlib
    import json

    from enkflow.experiment import config as ec

    defaults = AnalysisConfig.model_validate({"method": "letkf", "localization": {"radius": 1.0}}).model_dump(mode="json")
    for section, later in ec._LATER_ANALYSIS_KEYS.items():
        assert {k: defaults[section][k] for k in later} == later, section  # the table follows the models' defaults
    p = tmp_path / "exp.toml"
    p.write_text(TOML)
    cfg = load_experiment(p)
    d = cfg.model_dump(mode="json")
    before = {k: v for k, v in d["analysis"].items()  # as hashed before those keys existed
              if k not in ("balance", "observations", "observation_windows") and k not in ec.METHOD_TABLES}
    for section, later in ec._LATER_ANALYSIS_KEYS.items():
        before[section] = {k: v for k, v in before[section].items() if k not in later}
    old = {"analysis": before, "analysis_task": {k: v for k, v in d["analysis_task"].items()
                                                 if k not in ("max_attempts", "launcher")},
           "observations": ec._without_obs_defaults(d["observations"])}
    assert cfg.digests()["analysis"] == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    p.write_text(TOML.replace('metric = "sphere" }', 'metric = "sphere", max_obs = 50 }'))
    assert load_experiment(p).digests()["analysis"] != cfg.digests()["analysis"]


@pytest.mark.parametrize("old, new, key, message", [
    ('method = "letkf"', 'method = "enkf-n"\nenkf_n = { xm = 2.0 }', "analysis.enkf_n.xm",
     "unknown key analysis.enkf_n.xm; valid keys here: xn, g, rotate"),                                        # an unknown method option
    ('method = "letkf"', 'method = "enkf-n"\nenkf_n = { xn = 0.0 }', "analysis.enkf_n.xn", "greater than 0"),
    ("[analysis]", "[analysis]\nenkf_n = { xn = 2.0 }", "analysis.enkf_n",
     "[analysis.enkf_n] is for method 'enkf-n'; this study's method is 'letkf'"),              # a table for another method
    ('localization = { radius = 500.0, metric = "sphere" }', "", "analysis.localization",
     "method 'letkf' needs an [analysis.localization] table with 'radius'"),                   # localization missing
])
def test_method_options_are_checked_at_load(tmp_path: Path, old: str, new: str, key: str, message: str) -> None:
    err = _load(tmp_path, TOML.replace(old, new, 1))
    assert err.key == key
    assert message in str(err)


def test_enkflow_run_stops_at_a_method_table_for_another_method_before_any_forecast(tmp_path: Path, capsys) -> None:
    from enkflow.cli import main

    toml = tmp_path / "exp.toml"
    toml.write_text(TOML.replace("[analysis]", "[analysis]\nenkf_n = { xn = 2.0 }"))
    assert main(["run", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "enkflow run: error: " in err and "[analysis.enkf_n] is for method 'enkf-n'" in err and str(toml) in err
    assert not (tmp_path / "experiment").exists()  # nothing made, nothing run


@pytest.mark.parametrize("analysis, message", [
    ({"inflation": {"adaptive_damping": 0.5}}, "adaptive_damping is a parameter of an adaptive scheme, and adaptive = 'none'"),
    ({"inflation": {"adaptive_target": "posterior"}}, "adaptive_target is a parameter of an adaptive scheme"),
    ({"inflation": {"adaptive": "anderson2009", "adaptive_sd": "inf"}}, "finite number"),
    ({"method": "lnetf", "localization": {"radius": 3.0}, "lnetf": {"rs": "inf"}}, "finite number"),
    ({"method": "ensrf", "localization": {"radius": 3.0}, "kernel": "reference"}, "kernel = 'reference' is a choice of letkf and lestkf"),
    ({"method": "enkf-n", "kernel": "reference"}, "method 'enkf-n' has one implementation"),
])
def test_settings_the_method_would_ignore_or_fail_on_later_are_refused_at_load(analysis, message):
    with pytest.raises(ConfigError, match=message):
        validate(AnalysisConfig, {"method": "letkf", "localization": {"radius": 3.0}} | analysis, prefix="analysis")


def test_a_scheme_parameter_spelled_out_at_its_default_keeps_the_digest(tmp_path: Path) -> None:
    """A study made before the keys defaulted per scheme wrote Miyoshi's defaults; it resumes."""
    digests = []
    for extra in ("", ", adaptive_sd = 0.04, adaptive_maximum = 10.0"):
        toml = tmp_path / "exp.toml"
        toml.write_text(TOML + f'inflation = {{ adaptive = "miyoshi2011"{extra} }}\n')
        digests.append(load_experiment(toml).digests()["analysis"])
    assert digests[0] == digests[1]
