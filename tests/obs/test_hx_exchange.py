"""``HXExchange``: H(x) of owned observations from the rows of the ranks that hold them, equal bit for bit
to the replicated layout's Allreduce where an H row spans at most two ranks' blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_owned_hx_equals_the_allreduce_bitwise(mpi_script, n):
    assert mpi_script(HERE / "mpi_hx_exchange.py", n) == f"ok {n}"
