"""Shared fixtures: the venv's executables, the job-scheme tests' synthetic members."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.fixture
def mpiexec() -> str:
    """Path of the mpiexec that came with the `mpich` wheel (skips if absent)."""
    exe = BIN / "mpiexec"
    if not exe.exists():
        found = shutil.which("mpiexec")
        if not found:
            pytest.skip("no mpiexec: install the 'mpich' wheel (pip install -e .[dev])")
        return found
    return str(exe)


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for child processes: the venv first on PATH, one BLAS thread."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic land problem with 4 members (the job-scheme tests' ensemble), made once."""
    from jobs_helpers.experiments import synth_members

    return synth_members(tmp_path_factory.mktemp("synth"), 4)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real one-node SLURM (8 CPUs, dependent jobs ranked from their eligible time), started once per session."""
    from enkflow.errors import EnkflowError
    from enkflow_testing.localslurm import LocalSlurm, missing_reason

    reason = missing_reason()
    if reason:
        pytest.skip(f"local SLURM unavailable: {reason}")
    ls = LocalSlurm(tmp_path_factory.mktemp("slurm"), cpus=8, queue="eligible")
    try:
        ls.start()
    except EnkflowError as exc:
        if "installing" in str(exc):
            pytest.skip(f"local SLURM unavailable: {exc}")
        raise
    yield ls
    ls.stop()
