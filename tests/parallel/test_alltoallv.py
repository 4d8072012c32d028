"""``Comm.alltoallv_rows`` (row blocks between two decompositions) and ``Comm.alltoallv`` (rows of any
dtype), serial and under mpiexec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enkflow.parallel import SerialComm

HERE = Path(__file__).parent


def test_serial_alltoallv_is_a_fortran_copy():
    a = np.arange(12.0).reshape(4, 3)
    out = SerialComm().alltoallv_rows(a, [4], [4])
    assert out.flags.f_contiguous and np.array_equal(out, a) and out is not a
    with pytest.raises(ValueError):
        SerialComm().alltoallv_rows(a, [3], [3])


def test_serial_alltoallv_is_a_copy_with_its_count():
    rec = np.zeros(3, dtype=[("id", "i8"), ("v", "f4", (2,))])
    rec["id"] = [4, 5, 6]
    got, counts = SerialComm().alltoallv(rec, [3])
    assert got is not rec and np.array_equal(got, rec) and got.dtype == rec.dtype
    assert counts.dtype == np.int64 and counts.tolist() == [3]
    with pytest.raises(ValueError, match="sum to 2"):
        SerialComm().alltoallv(rec, [2])
    with pytest.raises(ValueError, match="1 send counts"):
        SerialComm().alltoallv(rec, [1, 2])
    with pytest.raises(ValueError, match="Python objects"):
        SerialComm().alltoallv(np.array([None]), [1])


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_alltoallv_rows_under_mpiexec(mpi_script, n):
    assert mpi_script(HERE / "mpi_alltoallv.py", n) == f"ok {n}"
