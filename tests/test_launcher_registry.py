"""The launcher registry: every ``[launcher] kind`` has a registered class that says what the driver and
the online supervisor need to know, so that neither names a launcher."""

from __future__ import annotations

from pathlib import Path

import pytest

from enkflow.config import validate
from enkflow.errors import ConfigError
from enkflow.jobs.config import LauncherSection
from enkflow.jobs.launchers import JOB_ID_VARIABLES, LAUNCHERS, LauncherKind, make_launcher
from enkflow.jobs.local import LocalLauncher
from enkflow.jobs.slurm import SlurmLauncher


def test_every_kind_is_registered_with_what_the_layers_above_ask() -> None:
    assert set(LAUNCHERS) == set(LauncherKind)
    for kind, cls in LAUNCHERS.items():
        assert cls.name == kind.value
        assert isinstance(cls.spans_hosts, bool) and cls.job_id_variable
    assert JOB_ID_VARIABLES == ("ENKFLOW_JOB_ID", "SLURM_JOB_ID")  # the order a worker looks in


def test_the_toml_strings_are_accepted_and_others_refused_naming_the_key() -> None:
    assert validate(LauncherSection, {"kind": "slurm"}).kind is LauncherKind.SLURM
    assert validate(LauncherSection, {}).kind is LauncherKind.LOCAL
    with pytest.raises(ConfigError) as ei:
        validate(LauncherSection, {"kind": "pbs"}, prefix="launcher")
    assert ei.value.key == "launcher.kind" and "'local' or 'slurm'" in str(ei.value)


def test_make_launcher_builds_the_kind_from_its_section(tmp_path: Path) -> None:
    local = make_launcher(LauncherSection(cpus=3), tmp_path / "local")
    assert isinstance(local, LocalLauncher) and local.cpus == 3
    assert make_launcher(LauncherSection(cpus=3), tmp_path, colocated=7).cpus == 7  # jobs that must run at once
    assert not (tmp_path / "local").exists()
    slurm = make_launcher(LauncherSection(kind="slurm", partition="p", extra=["--qos=x"], signal_margin=9),
                          tmp_path / "slurm", colocated=7)
    assert isinstance(slurm, SlurmLauncher) and slurm.script_dir == tmp_path / "slurm" and slurm.script_dir.is_dir()
    assert (slurm.partition, slurm.extra, slurm.signal_margin_s) == ("p", ["--qos=x"], 9)
    assert LAUNCHERS[LauncherKind.SLURM].spans_hosts and not LAUNCHERS[LauncherKind.LOCAL].spans_hosts
