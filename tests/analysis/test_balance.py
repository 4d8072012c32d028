"""The work-weighted decomposition's pure functions (enkflow.analysis.balance)."""

from __future__ import annotations

import numpy as np
import pytest

from enkflow.analysis import balance as B
from enkflow.errors import InputError


def test_sample_rows_covers_both_ends():
    assert B.sample_rows(10, 4).tolist() == [0, 4, 8, 9]
    assert B.sample_rows(9, 4).tolist() == [0, 4, 8]
    assert B.sample_rows(1, 64).tolist() == [0]
    assert B.sample_rows(0, 64).size == 0
    with pytest.raises(InputError):
        B.sample_rows(10, 0)


def test_interpolation_is_exact_on_sampled_rows_and_linear_between():
    rows = np.array([0, 4, 9])
    est = B.interpolate_counts(rows, np.array([10.0, 30.0, 30.0]), 10)
    assert est.shape == (10,)
    assert est[[0, 4, 9]].tolist() == [10.0, 30.0, 30.0]
    assert est[2] == 20.0


def test_domain_cost():
    assert B.domain_cost(np.array([0, 10]), 4, fixed=1.0).tolist() == [64.0, 10 * 16 + 64.0]
    assert B.domain_cost(np.array([0]), 4).tolist() == [B.FIXED_COST * 64.0]


@pytest.mark.parametrize("P", [1, 2, 3, 7, 16])
def test_split_is_contiguous_and_even(P):
    rng = np.random.default_rng(P)
    cost = np.concatenate((rng.uniform(50, 100, 300), rng.uniform(1, 2, 3000)))  # crowded "polar" rows first
    b = B.split_equal_cost(cost, P)
    assert b.shape == (P + 1,) and b[0] == 0 and b[-1] == cost.size and np.all(np.diff(b) >= 0)
    parts = B.part_costs(cost, b)
    assert np.isclose(parts.sum(), cost.sum())
    assert parts.max() - cost.sum() / P <= cost.max() + 1e-9
    assert B.imbalance(parts) < 1.05
    # Equal row counts would be far worse.
    eq = np.array([min(p * -(-cost.size // P), cost.size) for p in range(P + 1)])
    if P > 1:
        assert B.imbalance(B.part_costs(cost, eq)) > 1.5


def test_split_edge_cases():
    assert B.split_equal_cost(np.zeros(0), 3).tolist() == [0, 0, 0, 0]
    assert B.split_equal_cost(np.zeros(6), 3).tolist() == [0, 2, 4, 6]
    assert B.split_equal_cost(np.ones(2), 4)[-1] == 2
    with pytest.raises(InputError):
        B.split_equal_cost(np.array([1.0, -1.0]), 2)
    assert B.imbalance([1.0, 1.0]) == 1.0 and B.imbalance([0.0, 0.0]) == 1.0 and B.imbalance([3.0, 1.0]) == 1.5


def test_exchange_counts_move_every_row_once():
    src = np.array([0, 4, 8, 10])
    dst = np.array([0, 1, 7, 10])
    sends = np.array([B.exchange_counts(src, dst, r)[0] for r in range(3)])
    recvs = np.array([B.exchange_counts(src, dst, r)[1] for r in range(3)])
    assert np.array_equal(sends, recvs.T)
    assert sends.sum(axis=1).tolist() == [4, 4, 2] and recvs.sum(axis=1).tolist() == [1, 6, 3]
    with pytest.raises(InputError):
        B.exchange_counts(src, np.array([0, 1, 9]), 0)
