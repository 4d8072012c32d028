"""A balanced analysis (rows of equal estimated cost per rank, moved with Alltoallv) gives
the same analysis as the I/O row blocks, bitwise, for 1, 2, 3 and 8 ranks, on the synthetic
land problem; its diagnostics report the balance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def land(tmp_path_factory):
    d = tmp_path_factory.mktemp("land")
    out = subprocess.run([sys.executable, "-m", "enkflow", "synth", "--size", "small", "--members", "8", "--out", str(d)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return d


def run(mpiexec, env, n, src, out, radius=1500.0):
    cmd = [mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_balance.py"), str(src), str(out), str(radius)]
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


@pytest.mark.mpi
def test_balanced_analysis_equals_the_row_block_analysis(mpiexec, subprocess_env, land, tmp_path):
    res = {n: run(mpiexec, subprocess_env, n, land, tmp_path / f"r{n}.npz") for n in (1, 2, 3, 8)}
    ref = res[1]["none"]
    assert ref.shape[1] == 8
    import netCDF4
    with netCDF4.Dataset(land / "member_0001.nc") as ds:
        assert not np.array_equal(np.asarray(ds["soil_moisture"][:], dtype=np.float64), ref[:, 0])  # it analysed
    for n in (1, 2, 3, 8):
        assert int(res[n]["size"]) == n
        for key in ("none", "off", "on"):
            assert res[n][key].tobytes() == ref.tobytes(), (n, key)
        on = json.loads(str(res[n]["diag_on"]))
        off = json.loads(str(res[n]["diag_off"]))
        # [analysis] balance defaults to true; one rank has nothing to balance.
        assert json.loads(str(res[n]["diag_none"]))["balanced"] == (1.0 if n > 1 else 0.0)
        assert len(on["rank_analysis_s"]) == n and len(on["rank_cpu_s"]) == n
        assert np.isclose(sum(on["rank_est_work"]), 1.0) and sum(on["rank_rows"]) == ref.shape[0]
        assert on["imbalance_est"] <= 1.05
        if n > 1:  # the polar rows crowd the first and last blocks
            assert off["imbalance_est"] > on["imbalance_est"]
