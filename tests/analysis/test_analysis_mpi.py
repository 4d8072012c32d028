"""1, 2 and 3 MPI ranks give the same analysis (to 1e-12; the EnKF-N finds the same factor and
transform on every rank), and a fixed rank count gives bitwise-identical results."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


def run_ranks(mpiexec, env, n, path):
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
    cmd = [mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_analysis.py"), str(path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(path)


@pytest.mark.mpi
def test_rank_count_does_not_change_the_analysis(mpiexec, subprocess_env, tmp_path):
    res = {n: run_ranks(mpiexec, subprocess_env, n, tmp_path / f"r{n}.npz") for n in (1, 2, 3)}
    assert [int(res[n]["size"]) for n in (1, 2, 3)] == [1, 2, 3]
    for key in ("letkf", "etkf", "enkf", "enkfn"):
        ref = res[1][key]
        for n in (2, 3):
            assert np.abs(res[n][key] - ref).max() <= 1e-12 * np.abs(ref).max(), (key, n)
    again = run_ranks(mpiexec, subprocess_env, 2, tmp_path / "again.npz")
    for key in ("letkf", "etkf", "enkf", "enkfn"):
        assert again[key].tobytes() == res[2][key].tobytes()
