"""Output under MPI: rank 0 starts the writer, every rank adds its region, the files hold the whole field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from mpi_regions import NY, N, T, full  # noqa: E402


def test_ranks_add_their_regions(tmp_path: Path, mpiexec: str, subprocess_env: dict[str, str]) -> None:
    d = tmp_path / "out"
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, str(Path(__file__).parent / "mpi_regions.py"), str(d)],
                       capture_output=True, text=True, timeout=180, env=subprocess_env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rank 0 done" in r.stdout and "rank 1 done" in r.stdout
    with netCDF4.Dataset(d / "u.nc") as ds:  # one file growing along time, each rank's rows in every record
        assert list(ds["time"][:]) == list(range(T))
        for t in range(T):
            X = np.stack([full(t, m) for m in range(1, N + 1)])
            np.testing.assert_array_equal(ds["u"][t], X)
            np.testing.assert_allclose(ds["u_mean"][t], X.mean(0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(ds["u_spread"][t], X.std(0, ddof=1), rtol=1e-12, atol=1e-12)
        assert ds["u"].shape[2] == NY
