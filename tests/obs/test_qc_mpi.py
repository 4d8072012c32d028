"""QC under MPI: every rank rejects the same observations, and 2 and 3 ranks give the 1-rank analysis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


@pytest.mark.mpi
def test_every_rank_rejects_the_same_observations(mpiexec, subprocess_env, tmp_path: Path) -> None:
    res = {}
    for n in (1, 2, 3):
        out = tmp_path / f"r{n}.npz"
        proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_qc.py"), str(out)],
                              env=subprocess_env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res[n] = np.load(out)
    ref = res[1]
    assert ref["qc_gross"] >= 10 and ref["qc_rejected:ship"] > 0  # the planted errors, with the ships' 3.5 sigma
    for n in (2, 3):
        r = res[n]
        assert int(r["size"]) == n
        flags = r["flags"]
        assert flags.shape[0] == n and (flags == flags[0]).all()  # the same decision on every rank
        assert (flags[0] == ref["flags"][0]).all()
        for k in ("qc_rejected", "qc_gross", "qc_buddy", "qc_rejected:buoy", "qc_rejected:ship", "n_obs"):
            assert r[k] == ref[k], k
        assert np.abs(r["Xa"] - ref["Xa"]).max() <= 1e-12 * np.abs(ref["Xa"]).max()
