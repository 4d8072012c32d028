"""ExperimentDir owns the experiment directory's paths; every one is the path the runs have always used
(existing experiment directories are resumed from them)."""

from __future__ import annotations

from pathlib import Path

from enkflow.experiment.config import ExperimentConfig
from enkflow.experiment.directory import ExperimentDir
from enkflow.jobs.launchers import LauncherKind


def test_paths_are_the_ones_of_existing_experiment_directories(tmp_path: Path) -> None:
    x = ExperimentDir(tmp_path)
    want = {
        x.config: "config.json", x.state: "state.json", x.events: "events.jsonl", x.restarts_list: "restarts.txt",
        x.lock: "driver.lock", x.restart_copy(3, "r.nc"): "restarts/0003/r.nc", x.cycles: "cycles",
        x.output_service: "output_service", x.archive_staging: "archive/staging", x.archiver_log: "archive/archiver.log",
        x.launcher(LauncherKind.SLURM): "slurm",
    }
    c = x.cycle(12)
    want |= {c.path: "cycles/0012", c.tasks: "cycles/0012/tasks.json", c.digests: "cycles/0012/digests.json",
             c.settings: "cycles/0012/settings.json",
             c.logs: "cycles/0012/logs", c.done(4): "cycles/0012/done/task_004.json",
             c.work(4): "cycles/0012/work/member_004", c.applied: "cycles/0012/analysis_applied.json",
             c.mean: "cycles/0012/analysis_mean.nc", c.spread: "cycles/0012/analysis_spread.nc",
             c.obs_diag: "cycles/0012/obs_diag.nc"}
    o = x.online
    want |= {o.path: "online", o.token: "online/token", o.curve_public: "online/curve.pub",
             o.curve_secret: "online/curve.key", o.launch: "online/launch.json", o.address: "online/address",
             o.status: "online/status.json", o.stopping: "online/stopping.json", o.logs: "online/logs",
             o.checkpoints: "online/checkpoints"}
    assert {p: str(p.relative_to(tmp_path)) for p in want} == want


def test_the_configuration_resolves_its_directory(tmp_path: Path) -> None:
    cfg = ExperimentConfig.model_validate({
        "experiment": {"cycles": 2, "members": 2, "restart": "m/r_{member}.nc", "forecast_length": 1,
                       "directory": "exp", "initial": "copy"},
        "model": {"command": "true"}, "observations": {"file": "o_{cycle}.nc"},
        "analysis": {"method": "etkf"}, "base_dir": str(tmp_path)})
    assert cfg.dir == ExperimentDir(tmp_path / "exp")
    assert cfg.restart_path(2) == tmp_path / "exp" / "restarts" / "0002" / "r_2.nc"
    assert cfg.cycle_dir(3) == cfg.dir.cycle(3).path


def test_enum_settings_keep_the_digests_of_existing_experiments() -> None:
    """The flags that became enums dump to the same strings: the recorded digests still match (resume)."""
    cfg = ExperimentConfig.model_validate({
        "experiment": {"cycles": 2, "members": 2, "restart": "m/r_{member}.nc", "forecast_length": 1,
                       "directory": "exp", "initial": "copy", "mode": "offline"},
        "model": {"command": "true", "restart_write": "rename", "unchanged": "error"},
        "observations": {"file": "o_{cycle}.nc"},
        "analysis": {"method": "letkf", "kernel": "reference", "localization": {"radius": 3}},
        "launcher": {"kind": "slurm"}, "base_dir": "/x"})
    # Recorded with the string-typed schema (commit 7d0a604).
    assert cfg.digests() == {"ensemble": "be7207a8dd86b203", "model": "7c74c13db364efab", "analysis": "ca9abe6404639041"}
    dumped = cfg.to_json()
    assert (dumped["experiment"]["initial"], dumped["model"]["restart_write"], dumped["analysis"]["kernel"],
            dumped["launcher"]["kind"]) == ("copy", "rename", "reference", "slurm")
