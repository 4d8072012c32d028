"""``enkflow.obs.gathered`` on one rank: owned rows in file order, the RMS's bits, ownership errors
(several ranks: tests/analysis/mpi_obs_diag.py)."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.obs.gathered import RootOrder, rms
from enkflow.parallel import SerialComm


def test_rows_go_to_their_global_positions():
    rec = np.zeros(3, dtype=[("id", "i8"), ("xy", "f8", (2,))])
    rec["id"] = [2, 0, 1]
    got = RootOrder.of(SerialComm(), rec["id"], 3).gather(rec)
    assert got is not None and got.dtype == rec.dtype and got["id"].tolist() == [0, 1, 2]
    order = RootOrder.of(SerialComm(), np.array([1, 0]), 2)
    with pytest.raises(ValueError, match="expected 2 rows"):
        order.gather(np.zeros(3))


def test_rms_keeps_the_bits_of_the_whole_and_is_zero_without_observations():
    d = np.random.default_rng(3).standard_normal(10_001) * 1e3
    assert RootOrder.of(SerialComm(), np.arange(d.size), d.size).rms(d) == float(np.sqrt(np.mean(d ** 2)))
    assert RootOrder.of(SerialComm(), np.zeros(0, np.int64), 0).rms(np.zeros(0)) == 0.0 == rms(np.zeros(0))


@pytest.mark.parametrize("ids, message", [
    ([0, 1, 1, 2], "observation 1 of the cycle's 3 is owned by more than one rank"),
    ([0, 2], "observation 1 of the cycle's 3 is owned by no rank"),
    ([0, 1, 3], "observation id 3 is outside 0..2"),
])
def test_every_observation_needs_exactly_one_owner(ids, message):
    with pytest.raises(ValueError, match=message):
        RootOrder.of(SerialComm(), np.array(ids), 3).gather(np.zeros(len(ids)))
