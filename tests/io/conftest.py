"""Small ensembles for the I/O tests."""

from __future__ import annotations

import pytest

from enkflow.io.generate import make_ensemble


@pytest.fixture
def ensemble(tmp_path):
    """``make(fmt, dtypes, n=4, mb=0.2, **kw) -> (paths, StateConfig)`` in a fresh directory."""
    count = [0]

    def make(fmt="nc4", dtypes=("f8", "f8"), n=4, mb=0.2, **kw):
        count[0] += 1
        return make_ensemble(tmp_path / f"ens{count[0]}", n, mb, fmt=fmt, dtypes=dtypes, **kw)

    return make
