"""The local SLURM harness shares one munged between the instances alive at once (benchmarks side by side):
the last one to stop stops the munged one of them started, and not before (``enkflow_testing.localslurm``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from enkflow_testing.localslurm import MungeUsers


def test_the_last_instance_to_leave_stops_the_munged_one_of_them_started(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MungeUsers, "DIR", tmp_path)
    monkeypatch.setattr(MungeUsers, "MUNGED", tmp_path / "munged.pid")
    fake = tmp_path / "munged"  # a process whose name is munged
    shutil.copy("/bin/sleep", fake)
    munged = subprocess.Popen([str(fake), "60"])
    first, second = object(), object()
    try:
        with MungeUsers.locked():
            MungeUsers.join(first)
            MungeUsers.started(munged)
        with MungeUsers.locked():
            MungeUsers.join(second)  # found it answering: shares it
        MungeUsers.leave(first)
        assert munged.poll() is None  # the second one still authenticates through it
        MungeUsers.leave(second)
        assert munged.wait(timeout=15) is not None and not (tmp_path / "munged.pid").exists()
    finally:
        munged.kill()


def test_a_munged_the_harness_did_not_start_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MungeUsers, "DIR", tmp_path)
    monkeypatch.setattr(MungeUsers, "MUNGED", tmp_path / "munged.pid")
    fake = tmp_path / "munged"
    shutil.copy("/bin/sleep", fake)
    munged = subprocess.Popen([str(fake), "60"])
    only = object()
    try:
        with MungeUsers.locked():
            MungeUsers.join(only)
        MungeUsers.leave(only)
        assert munged.poll() is None
    finally:
        munged.kill()
