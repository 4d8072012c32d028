"""Work-weighted decomposition of a local analysis over ranks (issue 11).

A local domain with ``n_loc`` local observations costs about
``n_loc * N**2 + c N**3`` (forming the N x N local matrix, then its
eigendecomposition; ``c`` = :data:`FIXED_COST`, measured). On a lon-lat grid the polar rows have many more
observations within the cut-off than the equatorial ones, so the I/O row blocks
(equal row counts) carry very unequal work. These pure functions estimate each
row's cost and split the rows into contiguous ranges of equal estimated cost;
:func:`enkflow.experiment.cycling.analyse` moves the rows there with
``Comm.alltoallv_rows`` and back.

Counting local observations exactly for every row is a KD-tree query per row;
:func:`sample_rows` picks a sample (every ``stride``-th row and the last), and
:func:`interpolate_counts` fills the rest along the row order, which is
accurate where neighbouring rows are neighbouring points (grids stored row by
row).

Each row is charged the full cost of its domain: exact when every grid point is
one state row, proportional when every point has the same number of rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from enkflow.errors import InputError


def sample_rows(n_rows: int, stride: int) -> np.ndarray:
    """Rows whose local observations are counted: ``0, stride, 2 stride, ...`` and the last row.

    Returns (n_sample,) int64, ascending, unique; empty when ``n_rows`` is 0.
    """
    if stride < 1:
        raise InputError(f"the sampling stride must be >= 1, got {stride}", item="stride")
    if n_rows <= 0:
        return np.zeros(0, np.int64)
    s = np.arange(0, n_rows, stride, dtype=np.int64)
    if s[-1] != n_rows - 1:
        s = np.append(s, np.int64(n_rows - 1))
    return s


def interpolate_counts(rows: np.ndarray, counts: np.ndarray, n_rows: int) -> np.ndarray:
    """Local observation counts of every row, (n_rows,) float64, linearly interpolated from the
    counts ``counts`` (n_sample,) at ascending ``rows`` (n_sample,); constant beyond the ends."""
    rows = np.asarray(rows, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if rows.shape != counts.shape:
        raise InputError(f"rows {rows.shape} and counts {counts.shape} differ in shape", item="counts")
    if n_rows <= 0:
        return np.zeros(0)
    if rows.size == 0:
        return np.zeros(n_rows)
    return np.interp(np.arange(n_rows, dtype=np.float64), rows, counts)


#: The fixed cost of a domain in units of N**3, against one unit per local observation x N**2.
#: The eigendecomposition is ~9 N**3 flops against 2 N**2 per observation for the local matrix: 4.5
#: in flops. Fitted to the per-rank CPU seconds on the medium land problem (N = 40, 8 ranks, equal
#: estimated work; ranks of 23k rows at ~3,800 obs per point to 607k rows at ~50): 4.4 with the
#: blocked local search (2.9 before it, when the search's cost per observation was 2.5x higher).
FIXED_COST = 4.5


def domain_cost(n_local_obs: np.ndarray, n_members: int, fixed: float = FIXED_COST) -> np.ndarray:
    """Estimated cost of each local analysis: ``n_local_obs * N**2 + fixed * N**3``; same shape, float64."""
    n = float(n_members)
    return np.asarray(n_local_obs, dtype=np.float64) * n * n + fixed * n ** 3


def split_equal_cost(cost: np.ndarray, n_parts: int) -> np.ndarray:
    """Bounds (n_parts + 1,) int64 of ``n_parts`` contiguous row ranges of about equal total
    ``cost`` (n_rows,), non-negative: part ``p`` is rows ``bounds[p]:bounds[p+1]``;
    ``bounds[0] = 0``, ``bounds[-1] = n_rows``, non-decreasing.

    Part ``p`` ends at the first row where the cumulative cost reaches ``(p + 1) / n_parts``
    of the total (rounded to the nearer row boundary), so no part exceeds the mean by more
    than one row's cost.
    """
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 1:
        raise InputError(f"cost must be 1-D (n_rows,), got shape {c.shape}", item="cost")
    if n_parts < 1:
        raise InputError(f"n_parts must be >= 1, got {n_parts}", item="n_parts")
    if c.size and (not np.isfinite(c).all() or c.min() < 0):
        raise InputError("row costs must be finite and >= 0", item="cost")
    n = c.size
    cum = np.concatenate(([0.0], np.cumsum(c)))  # cum[i] = cost of rows [0, i)
    total = cum[-1]
    bounds = np.zeros(n_parts + 1, np.int64)
    bounds[-1] = n
    if n == 0 or total <= 0:
        bounds[1:-1] = [min(n, (p * n) // n_parts) for p in range(1, n_parts)]
        return bounds
    targets = total * np.arange(1, n_parts) / n_parts
    hi = np.searchsorted(cum, targets, side="left")  # first boundary with cum >= target
    lo = np.maximum(hi - 1, 0)
    nearer_lo = (targets - cum[lo]) <= (cum[np.minimum(hi, n)] - targets)
    b = np.where(nearer_lo, lo, hi)
    bounds[1:-1] = np.clip(b, 0, n)
    return np.maximum.accumulate(bounds)


def part_costs(cost: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Total ``cost`` (n_rows,) of each part of ``bounds`` (n_parts + 1,): (n_parts,) float64."""
    cum = np.concatenate(([0.0], np.cumsum(np.asarray(cost, dtype=np.float64))))
    b = np.asarray(bounds, dtype=np.int64)
    return cum[b[1:]] - cum[b[:-1]]


def imbalance(per_part: Sequence[float] | np.ndarray) -> float:
    """max / mean of ``per_part`` (n_parts,); 1.0 when perfectly even (or all zero)."""
    a = np.asarray(per_part, dtype=np.float64)
    m = a.mean() if a.size else 0.0
    return float(a.max() / m) if m > 0 else 1.0


def exchange_counts(src: np.ndarray, dst: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows that ``rank`` sends to and receives from each rank when moving from the
    decomposition ``src`` to ``dst`` (both (P + 1,) bounds of contiguous row ranges of the same
    rows). Returns ``(send_counts, recv_counts)``, each (P,) int64: ``send_counts[q]`` rows of
    ``rank``'s ``src`` range go to ``q``, in row order; ``recv_counts[q]`` rows of its ``dst``
    range come from ``q``."""
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    if s.shape != d.shape or s[0] != d[0] or s[-1] != d[-1]:
        raise InputError("the two decompositions must cover the same rows with the same rank count", item="bounds")

    def overlap(a0, a1, b0, b1):
        return np.maximum(0, np.minimum(a1, b1) - np.maximum(a0, b0))

    send = overlap(s[rank], s[rank + 1], d[:-1], d[1:])
    recv = overlap(s[:-1], s[1:], d[rank], d[rank + 1])
    return send.astype(np.int64), recv.astype(np.int64)
