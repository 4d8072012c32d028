"""LNETF under MPI: 1, 2 (rows balanced) and 3 ranks (row blocks) write the same bits over two
cycles of the small land problem: the rotation is drawn from (seed, cycle) and each domain's
analysis depends on its rows and the observations only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from test_analysis_step import synth

HERE = Path(__file__).parent
SIZE = os.environ.get("ENKFLOW_LNETF_MPI_SIZE", "tiny")  # "small": the check reported for issue 26 (slower)


def _state(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds["soil_moisture"][:])


@pytest.mark.mpi
def test_rank_count_and_balance_do_not_change_the_bits(mpiexec, subprocess_env, tmp_path):
    src = synth(tmp_path / "src", SIZE, 8)
    prior = _state(src / "member_0001.nc")
    results = {}
    for n, balance in ((1, "balance"), (2, "balance"), (3, "blocks")):
        d = tmp_path / f"m{n}"
        shutil.copytree(src, d)
        cmd = [mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_lnetf.py"), str(d), balance]
        path = os.pathsep.join(filter(None, [str(HERE), subprocess_env.get("PYTHONPATH")]))
        r = subprocess.run(cmd, env=dict(subprocess_env, PYTHONPATH=path), capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        results[n] = [_state(p).tobytes() for p in sorted(d.glob("member_*.nc"))]
    assert results[2] == results[1] and results[3] == results[1]
    assert not np.array_equal(_state(tmp_path / "m1" / "member_0001.nc"), prior)
