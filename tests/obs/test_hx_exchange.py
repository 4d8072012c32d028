"""``HXExchange``: H(x) of owned observations from the rows of the ranks that hold them, equal bit for bit
to the replicated layout's Allreduce where an H row spans at most two ranks' blocks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_owned_hx_equals_the_allreduce_bitwise(mpiexec, subprocess_env, tmp_path, n):
    out = tmp_path / "ok.txt"
    proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(HERE / "mpi_hx_exchange.py"), str(out)],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert out.read_text() == f"ok {n}"
