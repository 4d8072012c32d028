"""The serial filter and the LNETF at 3 ranks (rows balanced, so moved between ranks) write the same
bits over two cycles of the tiny land problem as in one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from mpi_methods import CONFIGS, analyse
from test_analysis_step import synth

from enkflow.parallel import SerialComm

HERE = Path(__file__).parent


def _members(d: Path) -> np.ndarray:
    out = []
    for p in sorted(d.glob("member_*.nc")):
        with netCDF4.Dataset(p) as ds:
            out.append(np.asarray(ds["soil_moisture"][:]))
    return np.stack(out)


@pytest.mark.mpi
def test_three_ranks_give_the_bits_of_one_process(mpiexec, subprocess_env, tmp_path):
    src = synth(tmp_path / "src", "tiny", 8)
    for method in CONFIGS:
        for n in (1, 3):
            shutil.copytree(src, tmp_path / f"r{n}" / method)
        analyse(tmp_path / "r1" / method, method, SerialComm())
    cmd = [mpiexec, "-n", "3", sys.executable, str(HERE / "mpi_methods.py"), str(tmp_path / "r3")]
    path = os.pathsep.join(filter(None, [str(HERE), subprocess_env.get("PYTHONPATH")]))
    r = subprocess.run(cmd, env=dict(subprocess_env, PYTHONPATH=path), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    for method in CONFIGS:
        one, three = _members(tmp_path / "r1" / method), _members(tmp_path / "r3" / method)
        assert np.array_equal(one, three), method
        assert not np.array_equal(one, _members(src)), method
