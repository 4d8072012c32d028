"""1 and 2 MPI ranks and several N_io give an identical X and identical updated files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from io_helpers import netcdf4_X

from enkflow.io import EnsembleFiles
from enkflow.io.generate import land_mask_config
from enkflow.state import StateLayout

CHILD = Path(__file__).with_name("mpi_io_child.py")
sys.path.insert(0, str(CHILD.parent))
from mpi_io_child import new_values  # noqa: E402

pytestmark = pytest.mark.mpi


def _mpirun(mpiexec, env, d, out, n_io, what):
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, str(CHILD), str(d), str(out), str(n_io), what],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_ranks_read_and_update_like_one(ensemble, tmp_path, mpiexec, subprocess_env):
    paths, _ = ensemble("cdf5", ("f8", "f4"), n=5)
    src = Path(paths[0]).parent
    lay = StateLayout.from_file(paths[0], ["var0", "var1"], mask=land_mask_config())
    ref = netcdf4_X(paths, lay)
    # serial reference update on a copy
    serial = tmp_path / "serial"
    shutil.copytree(src, serial)
    sp = sorted(str(p) for p in serial.glob("member_*.nc"))
    with EnsembleFiles(sp, lay, mode="r+") as ef:
        np.testing.assert_array_equal(ef.read(), ref)
        ef.update(new_values(np.arange(lay.n_rows), len(sp)))
    want = [open(p, "rb").read() for p in sp]

    cases = [(1, "update-safe"), (2, "update-safe"), (2, "update-spares"), (1, "update-log"), (2, "update-log"),
             (1, "update-unsafe"), (2, "read")]
    for n_io, what in cases:
        d = tmp_path / f"run_{n_io}_{what}"
        shutil.copytree(src, d)
        out = tmp_path / f"X_{n_io}_{what}.npy"
        _mpirun(mpiexec, subprocess_env, d, out, n_io, what)
        np.testing.assert_array_equal(np.load(out), ref)
        files = sorted(d.glob("member_*.nc"))
        if what != "read":
            for f, w in zip(files, want):
                assert f.read_bytes() == w, (n_io, what, f)
            left = [f for f in d.iterdir() if f.name.startswith(".") and f.name != ".enkflow-wal"]
            assert not left and not list(d.glob(".enkflow-wal/*")), left  # no marker, log, shadow or spare
