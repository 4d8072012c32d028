"""``Comm.barrier`` under mpiexec: it waits for the last rank, and the ranks waiting give their core
back instead of spinning (which, with more ranks than cores, took the working ranks' CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_barrier_waits_for_the_last_rank_without_spinning(mpi_script, n):
    assert mpi_script(HERE / "mpi_barrier.py", n).startswith(f"ok {n} ")
