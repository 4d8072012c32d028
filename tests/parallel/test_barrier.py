"""``Comm.barrier`` under mpiexec: it waits for the last rank, and the ranks waiting give their core
back instead of spinning (which, with more ranks than cores, took the working ranks' CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_barrier_waits_for_the_last_rank_without_spinning(mpiexec, subprocess_env, tmp_path, n):
    out = tmp_path / "ok.txt"
    proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_barrier.py"), str(out)],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text().startswith(f"ok {n} ")
