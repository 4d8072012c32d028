"""Adaptive inflation under MPI: the field's rows travel with the balanced rows, so 1 and 2 ranks
write the same inflation field and observation-space diagnostics (to 1e-12) over two cycles, for
Miyoshi's scheme and El Gharamti's as posterior inflation (DART's per-observation path)."""

from __future__ import annotations

import json
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


def _vars(path: Path) -> dict[str, np.ndarray]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        return {k: np.asarray(v[:]) for k, v in ds.variables.items()}


INFLATIONS = {"miyoshi2011": {"adaptive": "miyoshi2011", "adaptive_sd": 0.3},
              "gharamti2018": {"adaptive": "gharamti2018", "adaptive_sd": 0.1, "adaptive_target": "posterior"}}


@pytest.mark.mpi
def test_one_and_two_ranks_carry_the_same_field(mpiexec, subprocess_env, tmp_path):
    src = synth(tmp_path / "src", "tiny", 8)
    for n in (1, 2):
        cases = []
        for name, inflation in INFLATIONS.items():
            shutil.copytree(src, tmp_path / f"m{n}{name}")
            cases.append([str(tmp_path / f"m{n}{name}"), str(tmp_path / f"o{n}{name}"), inflation])
        cmd = [mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_adaptive.py"), json.dumps(cases)]
        path = os.pathsep.join(filter(None, [str(HERE), subprocess_env.get("PYTHONPATH")]))
        r = subprocess.run(cmd, env=dict(subprocess_env, PYTHONPATH=path), capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
    for name in INFLATIONS:
        for k in (1, 2):
            for file in ("inflation.nc", "obs_diag.nc"):
                a, b = (_vars(tmp_path / f"o{n}{name}" / f"c{k}" / file) for n in (1, 2))
                for v in a:
                    np.testing.assert_allclose(b[v], a[v], rtol=1e-12, atol=1e-14, err_msg=f"{name} {k} {file} {v}")
        f1, f2 = (_vars(tmp_path / f"o1{name}" / f"c{k}" / "inflation.nc")["inflation"] for k in (1, 2))
        assert f1.max() > 1.0 and not np.array_equal(f1, f2), name
