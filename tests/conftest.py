"""Shared fixtures: the venv's executables, the job-scheme tests' synthetic members."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
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


@pytest.fixture
def mpi_script(mpiexec: str, subprocess_env: dict[str, str], tmp_path: Path) -> Callable[[Path, int], str]:
    """Run a test's MPI script ``script`` on ``n`` ranks (its first argument: a file it writes when every
    check passed); fails with its output if it exits non-zero, else returns what it wrote."""

    def run(script: Path, n: int) -> str:
        out = tmp_path / f"ok-{script.stem}-{n}.txt"
        proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(script), str(out)], env=subprocess_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return out.read_text()

    return run


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


@pytest.fixture(scope="session")
def report_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    """One short offline demo (4 members, 2 cycles, adaptive inflation) for the report tests: its directory, what run_demo
    returned (with the page it wrote), and a copy of its run directory without a truth configured."""
    from enkflow.apps.demo import DemoSettings, run_demo  # heavy; only the report tests use it

    d = tmp_path_factory.mktemp("report") / "demo"
    lines: list[str] = []
    out = run_demo(d, DemoSettings(members=4, cycles=2, adaptive="miyoshi2011"), say=lines.append)
    out["lines"] = lines
    bare = d.parent / "run_without_truth"
    shutil.copytree(d / "run", bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg.pop("verification", None)
    (bare / "config.json").write_text(json.dumps(cfg))
    return d, out, bare
